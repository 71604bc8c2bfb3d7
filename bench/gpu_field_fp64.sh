#!/usr/bin/env bash
# The FP64-pipe Montgomery multipliers (fp64, fp64k; fp64c: column sums on the FP64 pipe too)
# and the dual-pipe layouts (dual: two elements per invocation, one through comba30kh, one
# through fp64k; dualint: two, both comba30kh, the control without the FP64 pipe) against the
# best integer layout (comba30kh) on the GPU machine: kernel-only sweep at n = 4M (the default
# --sweep-size), mul chain + add/mul/sqr, two workgroup sizes; tables at n = 1M. A layout the device cannot run exactly is listed as
# "skipped" with the reason (no shaderFloat64, or the self-test found an unfused GLSL Fma).
# Usage (from the repo root, on the device machine, with target/release/helios carried):
#   bench/gpu_field_fp64.sh OUTDIR
# LAYOUTS and WORKGROUPS (comma lists) replace the defaults below; HELIOS_PIPELINE_STATS=1
# adds the driver's register count and binary size of every kernel to field.txt.
set -uo pipefail
out=${1:?output dir}
for f in .gl/*.deb; do dpkg -x "$f" / 2>/dev/null; done; ldconfig
B=target/release/helios
$B info >/dev/null 2>&1 || export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
$B info > "$out/info.txt" 2>&1
grep -iE "device|driver|shader_int64|shader_float64" "$out/info.txt" | head -8
layouts=${LAYOUTS:-comba30kh,fp64,fp64k,fp64c,dual,dualint}
$B field bench --sweep --sweep-workgroups "${WORKGROUPS:-128,256}" --sweep-layouts "$layouts" \
  --budget 0.15 --sizes 1M --ops mul --json "$out/field.json" \
  > "$out/field.txt" 2>&1
rc=$?
grep -E "sweep|mul-chain|skipped|error|stats fq_mul_chain" "$out/field.txt"
exit $rc
