#!/usr/bin/env bash
# Fused attention on the GPU machine, one call: the attention test binary (correctness of the
# cooperative and SIMT kernels against the f64 CPU reference, relative errors per dtype), then
# `helios bench attention --compare torch` (SDPA and the naive form from the same run), a sweep
# of the cooperative forward tiles, and the driver's register/spill statistics of the kernels.
# Usage (repo root on the device machine): bench/gpu_attention.sh OUTDIR [DIR]
# DIR holds `helios` (release), `attn_test` (release test binary of crates/helios/tests/
# attention.rs) and torch_attention.py; default .carry/attn.
set -uo pipefail
out=${1:?output dir}; dir=${2:-.carry/attn}
for f in .gl/*.deb; do dpkg -x "$f" / 2>/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export PYTHONUNBUFFERED=1
B=$dir/helios
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
if [ -x "$dir/attn_test" ]; then
  timeout 240 "$dir/attn_test" --nocapture --test-threads=1 > "$out/tests.txt" 2>&1; echo "tests rc=$?"
  grep -E "test result|panicked|^attention |^coop |skipped|relative error" "$out/tests.txt" | head -60
fi
timeout 300 $B bench attention --compare torch --torch-script "$dir/torch_attention.py" \
  --json "$out/attention.json" > "$out/attention.txt" 2> "$out/attention.err"
echo "bench rc=$?"; grep -E "error|note" "$out/attention.err" | head; cat "$out/attention.txt"
for v in coop64x64 coop64x32 coop32x64 coop32x32; do
  echo "== forward tile $v"
  HELIOS_ATTN_VARIANT=$v timeout 60 $B bench attention --cases fwd --dtypes bf16 \
    --shapes 8x12x1024x64,4x16x2048x128 --samples 10 2>&1 | grep -E "^ +fwd|error"
done
HELIOS_PIPELINE_STATS=1 timeout 60 $B bench attention --quick --dtypes bf16,f32 2>&1 \
  | grep -E "attn_" | grep -viE "^ *(fwd|fwdbwd) " | head -20
