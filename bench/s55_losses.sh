#!/usr/bin/env bash
# Session 55, call 11: 12 GPT-2 bf16 training steps with session 54's main
# (.gpu/helios-main, 6b1256c) and this session's forward (.gpu/helios, 43d359b): the
# printed losses side by side (the forward's rounding moved: O is rescaled before P·V is
# added, not after). Then the forward's other tiles with the new order and V stage, two
# rounds: 192 × 64 (three consumer warpgroups) and 128 × 32.
source bench/s54_device.sh
for b in helios-main helios; do
  HELIOS_CACHE_DIR=/tmp/c-loss-$b timeout 100 .gpu/$b train --preset gpt2 --steps 12 --batch 8 --seq 1024 \
    --precision bf16 --eval-every 1000 --sample-tokens 0 --out /tmp/run-$b > $x/loss-$b.txt 2>&1
  echo "== $b rc=$?"; grep -iE "step|loss" $x/loss-$b.txt | tail -14
  rm -rf /tmp/run-$b
done
save
s=8x12x1024x64,8x12x2048x64
for r in 1 2; do
  for v in nv128x64 nv192x64 nv128x32; do attn $v helios $s bf16 HELIOS_ATTN_VARIANT=fwd=$v; done
done
for f in $x/nv*.txt; do echo "$f: $(grep -o 'GPU µs fwd [0-9.]*' $f | head -2 | awk '{print $4}' | tr '\n' ' ')"; done
save
