#!/usr/bin/env bash
# Session 54, call 5: DkDv with a third stage in its Q ring (HELIOS_EXP_DKDV_EXTRA=q) or
# its dO ring (=do) against the default (two each), on one H200: bench medians and profiled
# stages (bf16 and f16, untuned), two rounds; then the backward GPU test with each.
# (Ran with its own copy of `attn`, since factored into bench/s54_device.sh.)
source bench/s54_device.sh
S=8x12x1024x64,8x12x512x64
for r in 1 2; do
  attn new helios $S bf16,f16
  attn q3 helios $S bf16,f16 HELIOS_EXP_DKDV_EXTRA=q
  attn do3 helios $S bf16,f16 HELIOS_EXP_DKDV_EXTRA=do
done
save
for e in q do; do
  HELIOS_EXP_DKDV_EXTRA=$e HELIOS_CACHE_DIR=/tmp/c-test-$e timeout 150 .gpu/t_attention --test-threads 1 \
    native_backward > $x/test-$e.txt 2>&1 &
done
wait
for e in q do; do echo "== test native_backward $e"; grep -E "^test |test result|panicked" $x/test-$e.txt | head -3; done
save
