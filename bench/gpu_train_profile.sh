#!/usr/bin/env bash
# Per-kernel profile of GPT-2 124M training steps (8x1024) on the GPU machine: `helios train`
# with HELIOS_PROFILE=1 for each precision given (default fp32 bf16), the step's breakdown
# by kernel family for the note. The table covers every step after the first (`helios train`
# clears it after step 1, so compilation and tuning stay out).
# Usage: bench/gpu_train_profile.sh OUTDIR [precisions...]
set -uo pipefail
out=${1:?output dir}; shift
for f in .gl/*.deb; do dpkg -x "$f" / 2>/dev/null; done; ldconfig
B=${HELIOS_BIN:-target/release/helios}
$B info >/dev/null 2>&1 || export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export HELIOS_CACHE_DIR=${HELIOS_CACHE_DIR:-/tmp/helios-cache}
for p in "${@:-fp32 bf16}"; do
  for q in $p; do
    HELIOS_PROFILE=1 timeout 280 $B train --preset gpt2 --precision "$q" --batch 8 --seq 1024 \
      --steps 6 --eval-every 0 --sample-tokens 0 --out "/tmp/helios-run-$q" > "$out/profile-$q.txt" 2>&1
    echo "== $q rc=$?"; grep -E "ms|%" "$out/profile-$q.txt" | tail -45
  done
done
