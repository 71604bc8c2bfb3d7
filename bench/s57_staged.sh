#!/usr/bin/env bash
# For the session that measures the staging producer (session 57): the native forward's GPU
# test, then the forward with .gpu/helios (K and V through the producer's registers)
# against .gpu/helios-base (tensor copies, main) at GPT-2's shapes and head dim 128, both
# forward tiles forced at head dim 64, two rounds, profiled.
# .gpu/helios: 67727e1 with bench/results/2026-12-02-session57-staged-producer.patch applied.
source bench/s54_device.sh
gputest fwd native_forward
s=8x12x1024x64,8x12x2048x64
for r in 1 2; do
  for b in helios-base helios; do
    attn $b-128 $b $s bf16,f16 HELIOS_ATTN_VARIANT=fwd=nv128x64
    attn $b-192 $b $s bf16,f16 HELIOS_ATTN_VARIANT=fwd=nv192x64
    attn $b-d128 $b 4x16x2048x128 bf16
  done
done
save
