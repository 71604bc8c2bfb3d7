#!/usr/bin/env bash
# Session 53, last call: the forward's lazy row maxima (HELIOS_EXP_LAZY=1, read at kernel
# build) against the default on one H200: the native GPU tests with it, then the attention
# bench (bf16, two rounds, profiled stages) and the GPT-2 step. The knob lived only in the
# measured build (1f0d722, branch s53-lazy; a measured loser, not on main).
source bench/s53_device.sh
HELIOS_EXP_LAZY=1 HELIOS_CACHE_DIR=/tmp/c-lazy timeout 200 .gpu/t_attention --test-threads 1 native \
  > $x/test-lazy.txt 2>&1
echo "== test lazy rc=$?"; grep -E "test result|panicked|error" $x/test-lazy.txt | head; save
for r in 1 2; do for c in none lazy; do
  env $([ $c = lazy ] && echo HELIOS_EXP_LAZY=1) HELIOS_CACHE_DIR=/tmp/c-$c HELIOS_PROFILE=1 timeout 60 \
    .gpu/helios bench attention --shapes 8x12x1024x64,8x12x512x64 --dtypes bf16 > $x/attn-$c-$r.txt 2>&1
  echo "== attn $c round $r rc=$?"
  grep -E "^ +(fwd|fwdbwd) " $x/attn-$c-$r.txt | awk '{printf "%s %s %s | ", $1, $3, $4}'; echo
  grep -o 'GPU µs[^|]*' $x/attn-$c-$r.txt | head -4 | cut -c1-60; save
done; done
for c in none lazy; do
  env $([ $c = lazy ] && echo HELIOS_EXP_LAZY=1) HELIOS_CACHE_DIR=/tmp/c-$c timeout 70 .gpu/helios bench train \
    --cases gpt2 --dtypes bf16 > $x/train-$c.txt 2>&1
  echo "== train $c rc=$?"; grep -E "^gpt2" $x/train-$c.txt; save
done
