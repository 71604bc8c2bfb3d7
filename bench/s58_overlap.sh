#!/usr/bin/env bash
# Session 58: each item's epilogue run under the next item's first S, its last product
# under the hand-back and the next item's setup (.gpu/helios), against the turns alone
# (.gpu/helios-turns, d68fffe) and main at the session's start (.gpu/helios-base,
# 67727e1): both forward tiles at head dim 64, two rounds, profiled (stops on a hang);
# then the native forward's GPU test (~125 s).
source bench/s54_device.sh
s=8x12x1024x64,8x12x2048x64
for r in 1 2; do
  for b in helios helios-turns helios-base; do
    attn $b-192 $b $s bf16,f16 HELIOS_ATTN_VARIANT=fwd=nv192x64
    [ $r$b = 1helios ] && ! grep -q "fwd bf16" $x/$b-192-$r.txt && { save; exit 1; }
    attn $b-128 $b $s bf16 HELIOS_ATTN_VARIANT=fwd=nv128x64
  done
done
for f in $x/helios*-[12].txt; do echo "$f fwd: $(grep -o 'GPU µs fwd [0-9.]*' $f | awk '{print $4}' | tr '\n' ' ')"; done
save
HELIOS_CACHE_DIR=/tmp/c-test timeout 200 .gpu/t_attention --test-threads 1 native_forward \
  --nocapture > $x/test-fwd.txt 2>&1
echo "== test rc=$?"; grep -E "test result|panicked|nv192x64|nv128x64" $x/test-fwd.txt | head -20
save
