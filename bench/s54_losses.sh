#!/usr/bin/env bash
# Session 54, call 6: 12 GPT-2 bf16 training steps with session 53's main (.gpu/helios-main)
# and with this session's backward (.gpu/helios, f5e607f's kernels), on one H200: the
# printed losses side by side (the native backward's rounding changed, so close, not equal).
source bench/s54_device.sh
for b in helios-main helios; do
  HELIOS_CACHE_DIR=/tmp/c-loss-$b timeout 120 .gpu/$b train --preset gpt2 --steps 12 --batch 8 --seq 1024 \
    --precision bf16 --eval-every 1000 --sample-tokens 0 --out /tmp/run-$b > $x/loss-$b.txt 2>&1
  echo "== $b rc=$?"; grep -iE "step|loss" $x/loss-$b.txt | tail -16
  rm -rf /tmp/run-$b
done
save
