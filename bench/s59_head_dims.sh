#!/usr/bin/env bash
# Session 59: the native kernels at head dims off whole 64-channel panels and past 128
# (.gpu/helios, .gpu/t_attention): the GPU test of every stage at head dims 32 to 256, then
# fwd+bwd bf16 at 4×16×2048×D beside PyTorch, tuned, with the native path and without it
# (HELIOS_NATIVE=0: the SPIR-V kernels alone), profiled. Call 1 found DkDv wrong on 16-key
# blocks (its L and Dsum staging assumed 32 queries a block) and Dq missing at 256; call 2
# reruns both parts with them mended.
source bench/s54_device.sh
gputest heads native_head_dims
grep -E "^native" $x/test-heads.txt | cut -c1-150 | head -80
save
s=4x16x2048x32,4x16x2048x48,4x16x2048x96,4x16x2048x192
for native in 1 0; do
  # The SPIR-V kernels have none at 256 in 48 KiB.
  shapes=$s; [ $native = 1 ] && shapes=$s,4x16x2048x256
  HELIOS_NATIVE=$native HELIOS_ATTN_TUNE=1 HELIOS_PROFILE=1 HELIOS_CACHE_DIR=/tmp/c-hd$native \
    timeout 240 .gpu/helios bench attention --shapes $shapes --dtypes bf16 --compare torch \
    --json $x/heads-$native.json > $x/heads-$native.txt 2> $x/heads-$native.err
  echo "== bench native=$native rc=$?"; cut -c1-200 $x/heads-$native.txt | grep -vE "^\s*$" | head -40
  grep -iE "warn|error" $x/heads-$native.err | head -5
  save
done
