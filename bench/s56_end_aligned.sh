#!/usr/bin/env bash
# For the session that measures branch s55-end-aligned: the native forward's GPU test with
# end-aligned causal tiles, then the 192 x 64 tile against the default at T = 1024 and
# 2048 (profiled, two rounds), with .gpu/helios and .gpu/t_attention built from the branch
# and .gpu/helios-main from main.
source bench/s54_device.sh
HELIOS_CACHE_DIR=/tmp/c-test timeout 200 .gpu/t_attention --test-threads 1 native_forward --nocapture > $x/test-fwd.txt 2>&1
echo "== test native_forward rc=$?"; grep -E "test result|panicked" $x/test-fwd.txt | head -5
s=8x12x1024x64,8x12x2048x64
for r in 1 2; do
  for b in helios-main helios; do
    attn $b-128 $b $s bf16 HELIOS_ATTN_VARIANT=fwd=nv128x64
    attn $b-192 $b $s bf16 HELIOS_ATTN_VARIANT=fwd=nv192x64
  done
done
for f in $x/helios*.txt; do echo "$f: $(grep -o 'GPU µs fwd [0-9.]*' $f | head -2 | awk '{print $4}' | tr '\n' ' ')"; done
save
