#!/usr/bin/env bash
# Session 54, call 4 (the record, as session 53's): attention beside PyTorch (tuned, bf16
# and f16), the GPT-2 bf16 step beside eager and torch.compile (tuning off, same cache),
# then the native GPU tests, on one H200 with .gpu/helios and .gpu/t_attention built from
# the session's last kernel commit.
source bench/s54_device.sh
SHAPES=8x12x1024x64,8x12x512x64,4x16x2048x128
HELIOS_ATTN_TUNE=1 HELIOS_CACHE_DIR=/tmp/c-rec timeout 240 .gpu/helios bench attention --shapes $SHAPES \
  --dtypes bf16,f16 --compare torch --json $x/attention.json > $x/attention.txt 2> $x/attention.err
echo "== attention rc=$?"; cut -c1-200 $x/attention.txt; save
HELIOS_CACHE_DIR=/tmp/c-rec timeout 200 .gpu/helios bench train --cases gpt2 --dtypes bf16 \
  --compare torch > $x/train.txt 2> $x/train.err
echo "== train rc=$?"; cut -c1-220 $x/train.txt; save
HELIOS_CACHE_DIR=/tmp/c-test timeout 140 .gpu/t_attention --test-threads 1 native > $x/test-rec.txt 2>&1
echo "== test native rc=$?"; grep -E "^test |test result|panicked" $x/test-rec.txt | head -5
save
