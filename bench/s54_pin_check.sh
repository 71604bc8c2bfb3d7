#!/usr/bin/env bash
# Session 54, call 2: the backward's overlap (call 1's kernels, with DkDv's hang on items
# without blocks fixed) and, with HELIOS_EXP_PIN=1, the forward's and Dq's exponentials
# kept before their product's wait by a shared store, against main (.gpu/helios-main), on
# one H200: bench medians and profiled stages, two rounds; then the GPU tests with the pin.
# (Ran with its own copy of `attn`, since factored into bench/s54_device.sh.)
source bench/s54_device.sh
S=8x12x1024x64,8x12x512x64,4x16x2048x128
for r in 1 2; do
  attn main helios-main $S bf16
  attn new helios $S bf16
  attn pin helios $S bf16 HELIOS_EXP_PIN=1
done
save
HELIOS_EXP_PIN=1 HELIOS_CACHE_DIR=/tmp/c-test-pin timeout 300 .gpu/t_attention --test-threads 1 native > $x/test-pin.txt 2>&1
echo "== test native (pin) rc=$?"; grep -E "^test |test result|panicked" $x/test-pin.txt | head -5
save
