#!/usr/bin/env bash
# Session 55, call 12: the native forward's GPU test with the 192 × 64 tile among the
# candidates (.gpu/t_attention built from the commit that adds it).
source bench/s54_device.sh
HELIOS_CACHE_DIR=/tmp/c-test timeout 170 .gpu/t_attention --test-threads 1 native_forward --nocapture > $x/test-tall.txt 2>&1
echo "== test native_forward rc=$?"; grep -E "nv192x64|test result|panicked" $x/test-tall.txt | head -20
save
