#!/usr/bin/env bash
# Session 55, call 10: the native GPU tests (forward and backward against the f64
# reference) on .gpu/t_attention built from 43d359b.
source bench/s54_device.sh
HELIOS_CACHE_DIR=/tmp/c-test timeout 230 .gpu/t_attention --test-threads 1 native > $x/test-rec.txt 2>&1
echo "== test native rc=$?"; grep -E "^test |test result|panicked|err" $x/test-rec.txt | head -12
save
