#!/usr/bin/env bash
# Session 53, call 6: 192-query tiles with 64-key blocks at head dim 64, for the forward and
# for Dq, forced by HELIOS_ATTN_VARIANT against the default (nv128x64), on one H200; two
# rounds, profiled stages. (Their first-use checks against the reference run too.)
source bench/s53_device.sh
for r in 1 2; do for c in default fwd=nv192x64 dq=nv192x64; do
  v=$c; [ $c = default ] && v="fwd=nv128x64"
  HELIOS_ATTN_VARIANT=$v HELIOS_CACHE_DIR=/tmp/c-$r-$c HELIOS_PROFILE=1 timeout 45 .gpu/helios bench attention \
    --shapes 8x12x1024x64,8x12x512x64 --dtypes bf16 > $x/p-$c-$r.txt 2>&1
  echo "== $c round $r rc=$?"
  grep -E "^ +(fwd|fwdbwd) " $x/p-$c-$r.txt | awk '{printf "%s %s %s | ", $1, $3, $4}'; echo
  grep -o 'GPU µs[^|]*' $x/p-$c-$r.txt | head -4 | cut -c1-70; grep -iE "warn|fail|error" $x/p-$c-$r.txt | head -3
done; done
save
