#!/usr/bin/env bash
# Session 56's second record (call 6), .gpu/helios built from 9f76fd7 (lazy rescaling):
# attention beside PyTorch (tuned, bf16 and f16) and the GPT-2 bf16 step beside eager and
# torch.compile.
source bench/s54_device.sh
SHAPES=8x12x1024x64,8x12x512x64,4x16x2048x128
HELIOS_ATTN_TUNE=1 HELIOS_CACHE_DIR=/tmp/c-rec timeout 200 .gpu/helios bench attention --shapes $SHAPES \
  --dtypes bf16,f16 --compare torch --json $x/attention.json > $x/attention.txt 2> $x/attention.err
echo "== attention rc=$?"; cut -c1-200 $x/attention.txt; save
HELIOS_CACHE_DIR=/tmp/c-rec timeout 150 .gpu/helios bench train --cases gpt2 --dtypes bf16 \
  --compare torch > $x/train.txt 2> $x/train.err
echo "== train rc=$?"; cut -c1-220 $x/train.txt; save
