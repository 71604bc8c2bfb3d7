#!/usr/bin/env bash
# Session 56, call 2: how much the causal forward's static walk loses to imbalance. The
# 192 x 64 forward (end-aligned, .gpu/helios at 0db5389's kernels) at T = 1024 over batch
# sizes whose busiest SM has a known number of key blocks (a simulation of the walk:
# B=4: 20, 8: 40 (mean 37.1), 10: 50, 11: 51 (even), 12: 60, 16: 77, 22: 102 (even)).
source bench/s54_device.sh
s=4x12x1024x64,8x12x1024x64,10x12x1024x64,11x12x1024x64,12x12x1024x64,16x12x1024x64,22x12x1024x64
for r in 1 2; do
  env HELIOS_ATTN_VARIANT=fwd=nv192x64 HELIOS_CACHE_DIR=/tmp/c-bal HELIOS_PROFILE=1 timeout 100 .gpu/helios \
    bench attention --shapes $s --dtypes bf16 --cases fwd > $x/bal-$r.txt 2>&1
  echo "== round $r rc=$?"; grep -E "^ *fwd " $x/bal-$r.txt | awk '{print $3, $4}' | tr '\n' ' '; echo
  grep -o 'GPU µs fwd [0-9.]*' $x/bal-$r.txt | awk '{print $4}' | tr '\n' ' '; echo
done
save
