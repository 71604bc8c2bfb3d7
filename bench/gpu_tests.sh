#!/usr/bin/env bash
# Runs the engine's integration tests (release builds carried in .gpu/t_*) on the GPU machine,
# which has no validation layer: results are still checked against the CPU reference.
#
# Tuning is off (HELIOS_MATMUL_TUNE=0, HELIOS_ATTN_TUNE=0): with a fresh cache, tests that meet
# many shapes would tune each one; on an H100 `narrow_inputs` alone outlasted 100 s that way,
# and took 13 s for the whole matmul binary without. The tuners' own tests call them directly.
# Each binary gets TEST_TIMEOUT seconds (default 300: `cooperative_matrix_variants` alone took
# 187 s on an H100); one pipeline cache serves them all.
# Usage (repo root, device machine): bench/gpu_tests.sh OUTDIR [test binary filter args...]
set -uo pipefail
out=${1:?output dir}; shift
for f in .gl/*.deb; do dpkg -x "$f" / 2>/dev/null; done; ldconfig
if [ -x .gpu/helios ] && ! .gpu/helios info >/dev/null 2>&1; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
export HELIOS_VALIDATION=0 HELIOS_MATMUL_TUNE=0 HELIOS_ATTN_TUNE=0
HELIOS_CACHE_DIR=$(mktemp -d); export HELIOS_CACHE_DIR
for t in .gpu/t_*; do
  s=$(date +%s)
  timeout "${TEST_TIMEOUT:-300}" "$t" --test-threads 1 "$@" > "$out/$(basename "$t").txt" 2>&1
  rc=$?
  echo "== $t rc=$rc $(($(date +%s) - s)) s"
  grep -E "panicked|test result" "$out/$(basename "$t").txt" | tail -3 | tee -a "$out/tests.txt"
done
