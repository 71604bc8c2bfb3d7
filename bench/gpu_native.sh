#!/usr/bin/env bash
# The native (PTX) matmul path on the GPU machine, one call: device info, helios-vk's native
# launch tests and the native matmul tests against the f64 reference (release test binaries
# carried as .gpu/t_vk_native and .gpu/t_native_matmul), then `helios bench matmul` with the
# native variants forced beside the tuner's choice and cuBLAS.
# Usage (repo root, on the device machine): bench/gpu_native.sh OUTDIR [bench args...]
set -uo pipefail
out=${1:?output dir}; shift
for f in .gl/*.deb; do dpkg -x "$f" / 2>/dev/null; done; ldconfig
B=${B:-target/release/helios}
$B info >/dev/null 2>&1 || export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export PYTHONUNBUFFERED=1 HELIOS_VALIDATION=0
HELIOS_CACHE_DIR=$(mktemp -d); export HELIOS_CACHE_DIR
$B info > "$out/info.txt" 2>&1; grep -iE "driver|native|nvx" "$out/info.txt" | head -6
for t in vk_native native_matmul; do
  [ -x .gpu/t_$t ] || continue
  timeout ${TEST_TIMEOUT:-240} .gpu/t_$t --test-threads 1 --nocapture ${TESTS:-} > "$out/t_$t.txt" 2>&1
  echo "t_$t rc=$?"; grep -E "^test |SKIPPED|panicked|error" "$out/t_$t.txt" | head -20
done
[ -n "${NO_BENCH:-}" ] && exit 0
timeout ${BENCH_TIMEOUT:-300} $B bench matmul --json "$out/matmul.json" "$@" > "$out/matmul.txt" 2> "$out/matmul.err"
echo "bench rc=$?"; tail -5 "$out/matmul.err"
cat "$out/matmul.txt"
