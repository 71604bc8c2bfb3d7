#!/usr/bin/env bash
# Session 58: the forward's warpgroups taking turns (FlashAttention-3's ping-pong, one
# named barrier a warpgroup; .gpu/helios) against main without them (.gpu/helios-base,
# 67727e1): both forward tiles at head dim 64 (the three-warpgroup tile first: it hung in
# session 52), two rounds, profiled; then the native forward's GPU test (~190 s).
source bench/s54_device.sh
fwd_rounds helios helios-base
HELIOS_CACHE_DIR=/tmp/c-test timeout 280 .gpu/t_attention --test-threads 1 native_forward \
  --nocapture > $x/test-fwd.txt 2>&1
echo "== test rc=$?"; grep -E "test result|panicked|nv192x64" $x/test-fwd.txt | head -20
save
