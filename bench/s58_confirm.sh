#!/usr/bin/env bash
# Session 58: the forward beside cuDNN, three rounds in one process each (tuned, its own
# kernel cache, the tuning shared), .gpu/helios = d68fffe: is call 5's tie at T = 1024 more
# than one sample?
source bench/s54_device.sh
for r in 1 2 3; do
  HELIOS_ATTN_TUNE=1 HELIOS_CACHE_DIR=/tmp/c-conf timeout 150 .gpu/helios bench attention \
    --shapes 8x12x1024x64,8x12x512x64 --dtypes bf16,f16 --cases fwd --compare torch \
    > $x/confirm-$r.txt 2> $x/confirm-$r.err
  echo "== round $r rc=$?"; grep -E "^ *fwd " $x/confirm-$r.txt | awk '{print $1, $2, $3, "helios", $4, "p95", $5, "sdpa", $7, $9}'
done
save
