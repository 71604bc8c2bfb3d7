#!/usr/bin/env bash
# Occupancy probe for the cooperative-matrix variants: each forced variant at shapes giving
# 128, 256 and 512 workgroups (k = 8192). If the time grows with the workgroup count from
# 128 up, one workgroup is resident per SM (132 SMs).
# Usage (repo root, device machine): bench/gpu_occupancy.sh OUTDIR
set -uo pipefail
out=${1:?output dir}
B=target/release/helios
for spec in "coop128x64w2x2k32d2:1024x1024x8192,2048x1024x8192,4096x1024x8192" \
            "coop64x64w2x2k32d2:1024x512x8192,1024x1024x8192,2048x1024x8192" \
            "coop128x128w2x4k32d1:1024x2048x8192,2048x2048x8192,4096x2048x8192" \
            "coop128x256w2x4k16d3:2048x1024x8192,2048x2048x8192,4096x2048x8192"; do
  v=${spec%%:*}; shapes=${spec#*:}
  HELIOS_MATMUL_VARIANT=$v timeout 120 $B bench matmul --dtypes f16 --samples 5 --cases "$shapes" \
    > "$out/occ_$v.txt" 2> "$out/occ_$v.err"
  echo "== $v"; grep -E "^[0-9]+x" "$out/occ_$v.txt" | awk '{print $1, $5, $6, $9}'
done
