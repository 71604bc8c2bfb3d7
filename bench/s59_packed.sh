#!/usr/bin/env bash
# Session 59: the head-dims GPU test again with its packed-gradient check (head dims 80 and
# 256), then fwd+bwd at the head dims between call 2's (4×16×2048×{64,80,128,160} bf16,
# tuned, beside PyTorch).
source bench/s54_device.sh
gputest heads2 native_head_dims
save
HELIOS_ATTN_TUNE=1 HELIOS_PROFILE=1 HELIOS_CACHE_DIR=/tmp/c-hd2 timeout 200 .gpu/helios bench \
  attention --shapes 4x16x2048x64,4x16x2048x80,4x16x2048x128,4x16x2048x160 --dtypes bf16 \
  --compare torch --json $x/heads-2.json > $x/heads-2.txt 2> $x/heads-2.err
echo "== bench rc=$?"; cut -c1-200 $x/heads-2.txt
save
