#!/usr/bin/env bash
# The lm head's input gradient (8192×768×50264, the logits' gradient as A) on the GPU machine:
# A row-major as training stores it (NN) against A transposed (TN), and the same product with
# k = 8192 as a control, each native tile forced. Session 39's profile found this product at
# 144 TFLOP/s, a third of the same kernel's rate on a square (2026-11-29-native-split-h200.md).
# Usage (repo root, on the device machine): bench/gpu_lmhead.sh OUTDIR
set -uo pipefail
out=${1:?output dir}
for f in .gl/*.deb; do dpkg -x "$f" / 2>/dev/null; done; ldconfig
B=${HELIOS_BIN:-target/release/helios}
$B info >/dev/null 2>&1 || export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export HELIOS_VALIDATION=0 HELIOS_CACHE_DIR=$(mktemp -d)
cases=8192x768x50264:NN,8192x768x50264:TN,8192x768x8192:NN,8192x768x8192:TN
timeout 200 $B bench matmul --dtypes bf16 --samples 9 --cases $cases --compare torch \
  --variants nv256x192k16s3w2,nv128x192k16s4,nv128x192k32s2 > "$out/lmhead.txt" 2>&1
echo "rc=$?"; grep "bench:" "$out/lmhead.txt" | grep -v peak
