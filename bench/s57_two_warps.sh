#!/usr/bin/env bash
# For session 57: the producer with a warp a ring (.gpu/helios) against one warp for both
# (.gpu/helios-base, main), default tiles, forward and forward+backward, two rounds,
# profiled; then both native GPU tests.
# .gpu/helios: 67727e1 with bench/results/2026-12-02-session57-two-warp-producer.patch applied.
source bench/s54_device.sh
s=8x12x1024x64,8x12x2048x64,4x16x2048x128
for r in 1 2; do
  attn base helios-base $s bf16,f16
  attn two helios $s bf16,f16
done
for f in $x/*-[12].txt; do
  echo "$f fwd: $(grep -o 'GPU µs fwd [0-9.]*' $f | awk '{print $4}' | tr '\n' ' ')"
  echo "$f fwdbwd: $(grep -E '^ *fwdbwd ' $f | awk '{print $4}' | tr '\n' ' ')"
done
save
gputest native native_
save
