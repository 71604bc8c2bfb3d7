#!/usr/bin/env bash
# Workgroup-scope (VK_NV_cooperative_matrix2) matmul variants on the GPU machine, each forced
# in turn on a few shapes, next to the best subgroup-scope kernel; coopmat2 properties first.
# Usage (repo root, on the device machine): bench/gpu_wg_probe.sh [variants...]
set -uo pipefail
for f in .gl/*.deb; do dpkg -x "$f" / 2>/dev/null; done; ldconfig
B=target/release/helios
$B info >/dev/null 2>&1 || export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
$B info 2>&1 | sed -n '/cooperative matrix 2/,/granules/p'
HELIOS_CACHE_DIR=$(mktemp -d); export HELIOS_CACHE_DIR
cases=${CASES:-sq2048,sq4096,gpt2_qkv_fwd,gpt2_qkv_dw}
variants=${*:-wgt128x128k32w4 wgt128x128k32w8 wgt128x256k32w8 wgt256x128k32w8 wgt128x128k64w8 wgt128x256k64w8 wgt64x128k32w4 wgt128x128k16w4 coop128x256w2x4k16d1}
for v in $variants; do
  echo "== $v"
  HELIOS_MATMUL_VARIANT=$v timeout 90 $B bench matmul --cases "$cases" --dtypes f16 --samples 10 2>&1 \
    | grep -E "^(sq|gpt2)|rror" | head -6
done
