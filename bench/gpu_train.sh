#!/usr/bin/env bash
# GPT-2 training on the GPU machine, one call: `helios bench train` (DistilGPT-2 8x512 and
# GPT-2 124M 8x1024, fp32 and bf16) beside Hugging Face GPT-2 in PyTorch eager and
# torch.compile; the Helios side runs twice with one cache directory, so the second run's first
# step shows a warm pipeline cache and tuning store.
# Usage (repo root, on the device machine): bench/gpu_train.sh OUTDIR [bench args...]
set -uo pipefail
out=${1:?output dir}; shift
for f in .gl/*.deb; do dpkg -x "$f" / 2>/dev/null; done; ldconfig
B=${HELIOS_BIN:-target/release/helios}
$B info >/dev/null 2>&1 || export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export PYTHONUNBUFFERED=1 HELIOS_CACHE_DIR=/tmp/helios-cache
timeout 420 $B bench train --compare torch --json "$out/train.json" "$@" > "$out/train.txt" 2> "$out/train.err"
echo "bench rc=$?"; grep -E "error|note|bench:" "$out/train.err" | head -20; cat "$out/train.txt"
timeout 150 $B bench train --samples 5 --json "$out/train-warm.json" "$@" > "$out/train-warm.txt" 2>&1
echo "== second run (warm caches)"; cat "$out/train-warm.txt" | tail -6
