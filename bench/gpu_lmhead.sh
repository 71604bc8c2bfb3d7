#!/usr/bin/env bash
# The lm head's input gradient on the GPU machine (2026-11-29-lmhead-h200.md): GPT-2's
# 8192×768×50304 product with the logits' gradient as A, row-major as training stores it
# (NN: since 7099272 through a transposed copy of A) against A column-major (TN), two native
# tiles forced, beside cuBLAS; then the copy itself (`bench ops --cases transpose`) beside
# PyTorch's x.t().contiguous(), at the logits' shape and at GPT-2's weight shapes. With
# HELIOS_BIN_B set, the copy is also timed with that build (an A/B of a transpose kernel).
# Usage (repo root, on the device machine): bench/gpu_lmhead.sh OUTDIR
set -uo pipefail
out=${1:?output dir}
for f in .gl/*.deb; do dpkg -x "$f" / 2>/dev/null; done; ldconfig
B=${HELIOS_BIN:-target/release/helios}
$B info >/dev/null 2>&1 || export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export HELIOS_VALIDATION=0 HELIOS_CACHE_DIR=$(mktemp -d)
timeout 200 $B bench matmul --dtypes bf16 --samples 9 --compare torch \
  --cases 8192x768x50304:NN,8192x768x50304:TN --variants nv256x192k16s3w2,nv128x192k32s2 \
  > "$out/lmhead.txt" 2>&1
echo "matmul rc=$?"; grep "bench:" "$out/lmhead.txt" | grep -v peak
shapes=8192x50304,8192x768,768x3072,3072x768
timeout 200 $B bench ops --cases transpose --dtypes bf16,f32 --shapes $shapes --compare torch \
  > "$out/transpose.txt" 2>&1
echo "transpose rc=$?"; grep -E "^transpose|median" "$out/transpose.txt"
if [ -n "${HELIOS_BIN_B:-}" ]; then
  timeout 200 $HELIOS_BIN_B bench ops --cases transpose --dtypes bf16,f32 --shapes $shapes \
    > "$out/transpose-b.txt" 2>&1
  echo "transpose (B) rc=$?"; grep -E "^transpose|median" "$out/transpose-b.txt"
fi
