#!/usr/bin/env bash
# Session 56, call 5: the forward's running maximum moved only when a block's exceeds it
# by 2^8, O rescaled only by a warp whose maxima moved (.gpu/helios-lazy and its
# t_attention, 0db5389 plus the change) against 0db5389 (.gpu/helios): the native forward
# GPU test, then the default forward (untuned, profiled) at head dims 64 and 128, bf16 and
# f16, two rounds; then 12 GPT-2 bf16 steps (0db5389 printed validation 6.4272).
source bench/s54_device.sh
HELIOS_CACHE_DIR=/tmp/c-test timeout 200 .gpu/t_attention --test-threads 1 native_forward --nocapture > $x/test-fwd.txt 2>&1
echo "== test native_forward rc=$?"; grep -E "test result|panicked" $x/test-fwd.txt | head -5
grep -E "^native nv192x64|^native nv128x64 bf16 d64" $x/test-fwd.txt | head -12
s=8x12x1024x64,8x12x2048x64,4x16x2048x128
for r in 1 2; do
  for b in helios helios-lazy; do
    attn $b $b $s bf16 ; attn $b-f16 $b $s f16
  done
done
for f in $x/helios*.txt; do echo "$f: $(grep -o 'GPU µs fwd [0-9.]*' $f | awk '{print $4}' | tr '\n' ' ')"; done
save
losses helios-lazy
