#!/usr/bin/env bash
# Session 54, call 1: the backward's products overlapped with its exponentials (DkDv:
# Sᵀ's exponentials beside dPᵀ, dSᵀ beside dV's product; Dq: P's beside dP, and with
# HELIOS_EXP_DQ_ACROSS=1 the next block's S and dP issued behind dS·K) against main
# (.gpu/helios-main), on one H200: GPU tests, then bench medians and profiled stages.
source bench/s53_device.sh
HELIOS_CACHE_DIR=/tmp/c-test timeout 200 .gpu/t_attention --test-threads 1 native > $x/test-new.txt 2>&1
echo "== test native rc=$?"; grep -E "test result|panicked" $x/test-new.txt | head -3
HELIOS_EXP_DQ_ACROSS=1 HELIOS_CACHE_DIR=/tmp/c-test-across timeout 120 .gpu/t_attention --test-threads 1 native_backward > $x/test-across.txt 2>&1
echo "== test native_backward across rc=$?"; grep -E "test result|panicked" $x/test-across.txt | head -3
save
run() { # name binary [env]
  local n=$1 b=$2; shift 2
  env "$@" HELIOS_CACHE_DIR=/tmp/c-$n HELIOS_PROFILE=1 timeout 60 .gpu/$b bench attention \
    --shapes 8x12x1024x64,8x12x512x64,4x16x2048x128 --dtypes bf16 > $x/$n-$r.txt 2>&1
  echo "== $n round $r rc=$?"
  grep -E "^ +(fwd|fwdbwd) " $x/$n-$r.txt | awk '{printf "%s %s %s | ", $1, $3, $4}'; echo
  grep -o 'GPU µs[^|]*' $x/$n-$r.txt | head -6 | cut -c1-90; grep -iE "warn|fail" $x/$n-$r.txt | head -3
}
for r in 1 2; do
  run main helios-main
  run new helios
  run across helios HELIOS_EXP_DQ_ACROSS=1
done
save
