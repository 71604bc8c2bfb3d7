#!/usr/bin/env bash
# Session 54, call 3: the GPU tests of the committed backward overlap (per-ring stage
# counts in place), then Dq with a third K stage (HELIOS_EXP_DQ_K3=1) and with the next
# block's S and dP issued behind dS·K (HELIOS_EXP_DQ_ACROSS=1), against main
# (.gpu/helios-main), on one H200: bench medians and profiled stages.
source bench/s53_device.sh
HELIOS_CACHE_DIR=/tmp/c-test timeout 240 .gpu/t_attention --test-threads 1 native > $x/test-new.txt 2>&1
echo "== test native rc=$?"; grep -E "^test |test result|panicked" $x/test-new.txt | head -5
HELIOS_EXP_DQ_K3=1 HELIOS_EXP_DQ_ACROSS=1 HELIOS_CACHE_DIR=/tmp/c-test-k3 timeout 150 .gpu/t_attention --test-threads 1 native_backward > $x/test-k3.txt 2>&1
echo "== test native_backward k3+across rc=$?"; grep -E "^test |test result|panicked" $x/test-k3.txt | head -5
save
run() { # name binary [env]
  local n=$1 b=$2; shift 2
  env "$@" HELIOS_CACHE_DIR=/tmp/c-$n HELIOS_PROFILE=1 timeout 60 .gpu/$b bench attention \
    --shapes 8x12x1024x64,8x12x512x64,4x16x2048x128 --dtypes bf16 > $x/$n-$r.txt 2>&1
  echo "== $n round $r rc=$?"
  grep -E "^ *(fwd|fwdbwd) " $x/$n-$r.txt | awk '{printf "%s %s %s | ", $1, $3, $4}'; echo
  grep -o 'GPU µs[^|]*' $x/$n-$r.txt | head -6 | cut -c1-90; grep -iE "warn|fail" $x/$n-$r.txt | head -3
}
r=1; run main helios-main
for r in 1 2; do
  run new helios
  run k3 helios HELIOS_EXP_DQ_K3=1
  run k3across helios HELIOS_EXP_DQ_K3=1 HELIOS_EXP_DQ_ACROSS=1
done
save
