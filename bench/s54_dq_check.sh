#!/usr/bin/env bash
# Session 54, call 3: the GPU tests of the committed backward overlap (per-ring stage
# counts in place), then Dq with a third K stage (HELIOS_EXP_DQ_K3=1) and with the next
# block's S and dP issued behind dS·K (HELIOS_EXP_DQ_ACROSS=1), against main
# (.gpu/helios-main), on one H200: bench medians and profiled stages.
# (Ran with its own copy of `attn`, since factored into bench/s54_device.sh.)
source bench/s54_device.sh
S=8x12x1024x64,8x12x512x64,4x16x2048x128
HELIOS_CACHE_DIR=/tmp/c-test timeout 240 .gpu/t_attention --test-threads 1 native > $x/test-new.txt 2>&1
echo "== test native rc=$?"; grep -E "^test |test result|panicked" $x/test-new.txt | head -5
HELIOS_EXP_DQ_K3=1 HELIOS_EXP_DQ_ACROSS=1 HELIOS_CACHE_DIR=/tmp/c-test-k3 timeout 150 .gpu/t_attention --test-threads 1 native_backward > $x/test-k3.txt 2>&1
echo "== test native_backward k3+across rc=$?"; grep -E "^test |test result|panicked" $x/test-k3.txt | head -5
save
r=1; attn main helios-main $S bf16
for r in 1 2; do
  attn new helios $S bf16
  attn k3 helios $S bf16 HELIOS_EXP_DQ_K3=1
  attn k3across helios $S bf16 HELIOS_EXP_DQ_K3=1 HELIOS_EXP_DQ_ACROSS=1
done
save
