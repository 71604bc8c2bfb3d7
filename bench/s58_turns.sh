#!/usr/bin/env bash
# Session 58: the forward's warpgroups taking turns (FlashAttention-3's ping-pong, one
# named barrier a warpgroup; .gpu/helios) against main without them (.gpu/helios-base,
# 67727e1): both forward tiles at head dim 64 (the three-warpgroup tile first: it hung in
# session 52), two rounds, profiled; then the native forward's GPU test (~190 s).
source bench/s54_device.sh
s=8x12x1024x64,8x12x2048x64
for r in 1 2; do
  for b in helios helios-base; do
    attn $b-192 $b $s bf16,f16 HELIOS_ATTN_VARIANT=fwd=nv192x64
    [ $r$b = 1helios ] && ! grep -q "fwd bf16" $x/$b-192-$r.txt && { save; exit 1; }
    attn $b-128 $b $s bf16 HELIOS_ATTN_VARIANT=fwd=nv128x64
  done
done
for f in $x/helios*-[12].txt; do echo "$f fwd: $(grep -o 'GPU µs fwd [0-9.]*' $f | awk '{print $4}' | tr '\n' ' ')"; done
save
HELIOS_CACHE_DIR=/tmp/c-test timeout 280 .gpu/t_attention --test-threads 1 native_forward \
  --nocapture > $x/test-fwd.txt 2>&1
echo "== test rc=$?"; grep -E "test result|panicked|nv192x64" $x/test-fwd.txt | head -20
save
