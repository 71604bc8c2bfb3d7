#!/usr/bin/env bash
# For session 57: the forward's stage releases pinned where they are issued (.gpu/helios:
# each release in a one-trip loop, which ptxas does not sink past the softmax) against
# main (.gpu/helios-base), default tiles, two rounds, profiled; then 12 GPT-2 steps.
# .gpu/helios: 67727e1 with bench/results/2026-12-02-session57-pinned-release.patch.
source bench/s54_device.sh
s=8x12x1024x64,8x12x2048x64
for r in 1 2; do
  attn base helios-base $s bf16,f16
  attn pinned helios $s bf16,f16
done
for f in $x/*-[12].txt; do echo "$f fwd: $(grep -o 'GPU µs fwd [0-9.]*' $f | awk '{print $4}' | tr '\n' ' ')"; done
save
losses helios
