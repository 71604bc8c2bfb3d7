#!/usr/bin/env bash
# Session 54, call 1: the backward's products overlapped with its exponentials (DkDv:
# Sᵀ's exponentials beside dPᵀ, dSᵀ beside dV's product; Dq: P's beside dP, and with
# HELIOS_EXP_DQ_ACROSS=1 the next block's S and dP issued behind dS·K) against main
# (.gpu/helios-main), on one H200: GPU tests, then bench medians and profiled stages.
# (Ran with its own copy of `attn`, since factored into bench/s54_device.sh.)
source bench/s54_device.sh
S=8x12x1024x64,8x12x512x64,4x16x2048x128
HELIOS_CACHE_DIR=/tmp/c-test timeout 200 .gpu/t_attention --test-threads 1 native > $x/test-new.txt 2>&1
echo "== test native rc=$?"; grep -E "test result|panicked" $x/test-new.txt | head -3
HELIOS_EXP_DQ_ACROSS=1 HELIOS_CACHE_DIR=/tmp/c-test-across timeout 120 .gpu/t_attention --test-threads 1 native_backward > $x/test-across.txt 2>&1
echo "== test native_backward across rc=$?"; grep -E "test result|panicked" $x/test-across.txt | head -3
save
for r in 1 2; do
  attn main helios-main $S bf16
  attn new helios $S bf16
  attn across helios $S bf16 HELIOS_EXP_DQ_ACROSS=1
done
save
