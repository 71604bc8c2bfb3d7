#!/usr/bin/env bash
# Session 54, call 2: the backward's overlap (call 1's kernels, with DkDv's hang on items
# without blocks fixed) and, with HELIOS_EXP_PIN=1, the forward's and Dq's exponentials
# kept before their product's wait by a shared store, against main (.gpu/helios-main), on
# one H200: bench medians and profiled stages, two rounds; then the GPU tests with the pin.
source bench/s53_device.sh
run() { # name binary [env]
  local n=$1 b=$2; shift 2
  env "$@" HELIOS_CACHE_DIR=/tmp/c-$n HELIOS_PROFILE=1 timeout 60 .gpu/$b bench attention \
    --shapes 8x12x1024x64,8x12x512x64,4x16x2048x128 --dtypes bf16 > $x/$n-$r.txt 2>&1
  echo "== $n round $r rc=$?"
  grep -E "^ *(fwd|fwdbwd) " $x/$n-$r.txt | awk '{printf "%s %s %s | ", $1, $3, $4}'; echo
  grep -o 'GPU µs[^|]*' $x/$n-$r.txt | head -6 | cut -c1-90; grep -iE "warn|fail" $x/$n-$r.txt | head -3
}
for r in 1 2; do
  run main helios-main
  run new helios
  run pin helios HELIOS_EXP_PIN=1
done
save
HELIOS_EXP_PIN=1 HELIOS_CACHE_DIR=/tmp/c-test-pin timeout 300 .gpu/t_attention --test-threads 1 native > $x/test-pin.txt 2>&1
echo "== test native (pin) rc=$?"; grep -E "^test |test result|panicked" $x/test-pin.txt | head -5
save
