#!/usr/bin/env bash
# Session 55's record (call 9): the forward before and after the session (profiled, two
# rounds: .gpu/helios-main 6b1256c, .gpu/helios-fdc fdc1e44 the new order, .gpu/helios
# 43d359b with the third V stage); then, as session 54's record, attention beside PyTorch
# (tuned, bf16 and f16) and the GPT-2 bf16 step beside eager and torch.compile.
source bench/s54_device.sh
AB=8x12x1024x64,8x12x2048x64,4x16x2048x128
for r in 1 2; do
  for b in helios-main helios-fdc helios; do attn $b $b $AB bf16; done
done
for f in $x/helios*.txt; do echo "$f: $(grep -o 'GPU µs [a-z]* [0-9.]*' $f | awk '{print $3, $4}' | tr '\n' ' ')"; done
save
SHAPES=8x12x1024x64,8x12x512x64,4x16x2048x128
HELIOS_ATTN_TUNE=1 HELIOS_CACHE_DIR=/tmp/c-rec timeout 200 .gpu/helios bench attention --shapes $SHAPES \
  --dtypes bf16,f16 --compare torch --json $x/attention.json > $x/attention.txt 2> $x/attention.err
echo "== attention rc=$?"; cut -c1-200 $x/attention.txt; save
HELIOS_CACHE_DIR=/tmp/c-rec timeout 150 .gpu/helios bench train --cases gpt2 --dtypes bf16 \
  --compare torch > $x/train.txt 2> $x/train.err
echo "== train rc=$?"; cut -c1-220 $x/train.txt; save
