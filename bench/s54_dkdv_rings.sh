#!/usr/bin/env bash
# Session 54, call 5: DkDv with a third stage in its Q ring (HELIOS_EXP_DKDV_EXTRA=q) or
# its dO ring (=do) against the default (two each), on one H200: bench medians and profiled
# stages (bf16 and f16, untuned), two rounds; then the backward GPU test with each.
source bench/s53_device.sh
run() { # name [env]
  local n=$1; shift
  env "$@" HELIOS_CACHE_DIR=/tmp/c-$n HELIOS_PROFILE=1 timeout 60 .gpu/helios bench attention \
    --shapes 8x12x1024x64,8x12x512x64 --dtypes bf16,f16 > $x/$n-$r.txt 2>&1
  echo "== $n round $r rc=$?"
  grep -E "^ *(fwd|fwdbwd) " $x/$n-$r.txt | awk '{printf "%s %s %s %s | ", $1, $2, $3, $4}'; echo
  grep -o 'GPU µs[^|]*' $x/$n-$r.txt | grep dkdv | cut -c1-40 | tr '\n' ' '; echo
  grep -iE "warn|fail" $x/$n-$r.txt | head -3
}
for r in 1 2; do
  run new
  run q3 HELIOS_EXP_DKDV_EXTRA=q
  run do3 HELIOS_EXP_DKDV_EXTRA=do
done
save
for e in q do; do
  HELIOS_EXP_DKDV_EXTRA=$e HELIOS_CACHE_DIR=/tmp/c-test-$e timeout 150 .gpu/t_attention --test-threads 1 \
    native_backward > $x/test-$e.txt 2>&1 &
done
wait
for e in q do; do echo "== test native_backward $e"; grep -E "^test |test result|panicked" $x/test-$e.txt | head -3; done
save
