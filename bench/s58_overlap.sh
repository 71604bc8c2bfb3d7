#!/usr/bin/env bash
# Session 58: each item's epilogue run under the next item's first S, its last product
# under the hand-back and the next item's setup (.gpu/helios), against the turns alone
# (.gpu/helios-turns, d68fffe) and main at the session's start (.gpu/helios-base,
# 67727e1): both forward tiles at head dim 64, two rounds, profiled (stops on a hang);
# then the native forward's GPU test (~125 s).
source bench/s54_device.sh
fwd_rounds helios helios-turns helios-base
HELIOS_CACHE_DIR=/tmp/c-test timeout 200 .gpu/t_attention --test-threads 1 native_forward \
  --nocapture > $x/test-fwd.txt 2>&1
echo "== test rc=$?"; grep -E "test result|panicked|nv192x64|nv128x64" $x/test-fwd.txt | head -20
save
