#!/usr/bin/env bash
# Session 56, call 4: 12 GPT-2 bf16 steps with main (.gpu/helios-main, 6aeb8ab) and
# 0db5389 (.gpu/helios: the 192 x 64 end-aligned forward), losses side by side (the same
# per-row arithmetic: expected identical); then the forward's rings with the third stage
# in K's instead of V's (.gpu/helios-k3) against 0db5389, both tiles, two rounds, and
# 0db5389's forward in f16 beside bf16.
source bench/s54_device.sh
losses helios-main helios
s=8x12x1024x64,8x12x2048x64
for r in 1 2; do
  for b in helios helios-k3; do
    attn $b-192 $b $s bf16 HELIOS_ATTN_VARIANT=fwd=nv192x64
    attn $b-128 $b $s bf16 HELIOS_ATTN_VARIANT=fwd=nv128x64
  done
  attn f16 helios $s f16 HELIOS_ATTN_VARIANT=fwd=nv192x64
done
for f in $x/helios*.txt $x/f16*.txt; do echo "$f: $(grep -o 'GPU µs fwd [0-9.]*' $f | head -2 | awk '{print $4}' | tr '\n' ' ')"; done
save
