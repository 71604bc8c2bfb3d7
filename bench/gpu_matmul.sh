#!/usr/bin/env bash
# Matmul on the GPU machine, one call: device info, every matmul variant against the f64
# reference (the release test binary carried as .gpu/t_matmul, if present), then
# `helios bench matmul --compare torch` (coop peak, tuner reports, cuBLAS side by side).
# Usage (repo root, on the device machine): bench/gpu_matmul.sh OUTDIR [bench args...]
# TESTS=<filter> runs only matching tests; TEST_TIMEOUT=<s> (default 150) bounds them: every
# test of the binary compiles dozens of pipelines: all ten took 319 s on an H100, which
# leaves no room for the benchmark inside one 600 s device call.
set -uo pipefail
out=${1:?output dir}; shift
for f in .gl/*.deb; do dpkg -x "$f" / 2>/dev/null; done; ldconfig
B=${B:-target/release/helios}
$B info >/dev/null 2>&1 || export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export PYTHONUNBUFFERED=1
HELIOS_CACHE_DIR=$(mktemp -d); export HELIOS_CACHE_DIR
$B info > "$out/info.txt" 2>&1; grep -E "driver|16x16x16" "$out/info.txt" | head -4
if [ -x .gpu/t_matmul ]; then
  timeout ${TEST_TIMEOUT:-150} .gpu/t_matmul --test-threads 1 ${TESTS:-} > "$out/tests.txt" 2>&1; echo "tests rc=$?"
  grep -E "^test |SKIPPED|panicked|relative error" "$out/tests.txt" | head -30
fi
timeout 420 $B bench matmul --compare torch --json "$out/matmul.json" "$@" > "$out/matmul.txt" 2> "$out/matmul.err"
echo "bench rc=$?"; grep -E "peak|error|note" "$out/matmul.err" | head; tail -3 "$out/matmul.err"
cat "$out/matmul.txt"
cp "$HELIOS_CACHE_DIR"/matmul/*.tsv "$out/" 2>/dev/null
# The pipeline cache the driver filled: bench/sass_mix.py reads the SASS out of it.
mkdir -p "$out/pipelines"; cp "$HELIOS_CACHE_DIR"/pipelines/*.bin "$out/pipelines/" 2>/dev/null
