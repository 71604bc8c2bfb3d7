#!/usr/bin/env bash
# For session 57: part of the forward's exponentials on the FMA pipe (`ex2_fma`), the
# elements i % 8 < HELIOS_EXP2_FMA of each thread's 32 (0: all on the SFU), default tiles,
# two rounds, profiled; .gpu/helios-base is main. Then the native forward's GPU test
# with 3 of 8 on the FMA pipe.
# .gpu/helios: 67727e1 with bench/results/2026-12-02-session57-ex2-fma.patch applied.
source bench/s54_device.sh
s=8x12x1024x64,8x12x2048x64,4x16x2048x128
for r in 1 2; do
  attn base helios-base $s bf16,f16
  for n in 0 2 3 4; do attn fma$n helios $s bf16,f16 HELIOS_EXP2_FMA=$n; done
done
for f in $x/*-[12].txt; do echo "$f: $(grep -o 'GPU µs fwd [0-9.]*' $f | awk '{print $4}' | tr '\n' ' ')"; done
save
gputest fwd native_forward HELIOS_EXP2_FMA=3
save
