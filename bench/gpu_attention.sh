#!/usr/bin/env bash
# Fused attention on the GPU machine, one call: the attention test binary (correctness of the
# cooperative and SIMT kernels against the f64 CPU reference, relative errors per dtype), then
# `helios bench attention --compare torch` (SDPA and the naive form from the same run) on a
# fresh cache, so the block-size tuner runs (its winners are printed), the driver's register
# statistics of the kernels, and the SASS instruction mix of the hot loops (bench/sass_mix.py,
# where python3 has zstandard and nvdisasm).
# Usage (repo root on the device machine): bench/gpu_attention.sh OUTDIR [DIR]
# DIR holds `helios` (release), `attn_test` (release test binary of crates/helios/tests/
# attention.rs), torch_attention.py and sass_mix.py; default .carry/attn.
set -uo pipefail
out=${1:?output dir}; dir=${2:-.carry/attn}
for f in .gl/*.deb; do dpkg -x "$f" / 2>/dev/null; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export PYTHONUNBUFFERED=1
B=$dir/helios
cache=/tmp/helios-attn-cache; rm -rf $cache; export HELIOS_CACHE_DIR=$cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ -x "$dir/attn_test" ]; then
  HELIOS_ATTN_TUNE=0 timeout 240 "$dir/attn_test" --nocapture --test-threads=1 > "$out/tests.txt" 2>&1
  echo "tests rc=$?"
  grep -E "test result|panicked|^attention |relative error" "$out/tests.txt" | head -20
fi
timeout 400 $B bench attention --compare torch --torch-script "$dir/torch_attention.py" \
  --json "$out/attention.json" > "$out/attention.txt" 2> "$out/attention.err"
echo "bench rc=$?"; grep -E "error|note" "$out/attention.err" | head; cat "$out/attention.txt"
echo "== tuned winners"; cat $cache/attention/*.tsv; cp $cache/attention/*.tsv "$out/tuning.tsv"
HELIOS_PIPELINE_STATS=1 timeout 60 $B bench attention --quick --dtypes bf16 \
  --shapes 1x2x70x64,1x2x70x128 2>&1 | grep -E "stats attn_" \
  | sed 's/, Stack Size=0, Local Memory Size=68719476736//'
if [ -f "$dir/sass_mix.py" ]; then
  timeout 60 python3 "$dir/sass_mix.py" $cache/pipelines/*.bin 'attn_(fwd|dkdv|dq)_bf16_d64' \
    > "$out/sass.txt" 2>&1; echo "sass rc=$?"; head -80 "$out/sass.txt"
fi
