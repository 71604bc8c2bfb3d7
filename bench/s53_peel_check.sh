#!/usr/bin/env bash
# Session 53, call 7: the pipelined forward with its unmasked blocks peeled out of the
# masked ones (branch s53-peel; .gpu/helios) against main (.gpu/helios-main), on one H200:
# bench medians and profiled stages, two rounds, then the native forward's GPU test.
source bench/s53_device.sh
for r in 1 2; do for b in helios-main helios; do
  HELIOS_CACHE_DIR=/tmp/c-$b HELIOS_PROFILE=1 timeout 40 .gpu/$b bench attention \
    --shapes 8x12x1024x64,8x12x512x64 --dtypes bf16 > $x/peel-$b-$r.txt 2>&1
  echo "== $b round $r rc=$?"
  grep -E "^ +(fwd|fwdbwd) " $x/peel-$b-$r.txt | awk '{printf "%s %s %s | ", $1, $3, $4}'; echo
  grep -o 'GPU µs[^|]*' $x/peel-$b-$r.txt | head -4 | cut -c1-70; grep -iE "warn|fail" $x/peel-$b-$r.txt | head -3
done; done
save
HELIOS_CACHE_DIR=/tmp/c-test timeout 90 .gpu/t_attention --test-threads 1 native_forward > $x/test-peel.txt 2>&1
echo "== test native_forward rc=$?"; grep -E "test result|panicked" $x/test-peel.txt | head -3
save
