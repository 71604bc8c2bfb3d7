#!/usr/bin/env bash
# Session 59: every attention GPU test (.gpu/t_attention, the head-dims commit: the native
# kernels now the default at every head dim from 32 to 256), then GPT-2 124M decoding bf16,
# 8-token prompt and 1000 new tokens (the cache up to 1008 keys), profiled: how much of a
# token the single-query decode attention takes (the SPIR-V kernels), beside Hugging Face.
source bench/s54_device.sh
HELIOS_CACHE_DIR=/tmp/c-test timeout 420 .gpu/t_attention --test-threads 1 --nocapture \
  > $x/test-all.txt 2>&1
echo "== tests rc=$?"; grep -E "^test |test result|panicked" $x/test-all.txt | head -30
save
HELIOS_PROFILE=1 HELIOS_CACHE_DIR=/tmp/c-gen timeout 150 .gpu/helios bench generate --dtypes bf16 \
  --samples 1000 --compare torch > $x/gen.txt 2> $x/gen.err
echo "== generate rc=$?"; cut -c1-200 $x/gen.txt
grep -iE -B2 -A25 "warm bf16 batch 1," $x/gen.err | cut -c1-160 | head -40
save
