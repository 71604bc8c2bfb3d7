#!/usr/bin/env bash
# The lazy graph on the GPU machine, one call: `helios bench graph` beside PyTorch eager and
# torch.compile, then the same with HELIOS_PROFILE=1 (the MLP block's share outside matmul)
# and with HELIOS_FUSION=0 (node by node: what fusion buys).
# Usage (repo root, on the device machine): bench/gpu_graph.sh OUTDIR [bench args...]
# The bench args go to all three runs (e.g. `--cases chain1000,roundtrip,host12`).
set -uo pipefail
out=${1:?output dir}; shift
for f in .gl/*.deb; do dpkg -x "$f" / 2>/dev/null; done; ldconfig
B=${HELIOS_BIN:-target/release/helios}
$B info >/dev/null 2>&1 || export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export PYTHONUNBUFFERED=1
timeout 400 $B bench graph --compare torch --json "$out/graph.json" "$@" > "$out/graph.txt" 2> "$out/graph.err"
echo "bench rc=$?"; grep -E "error|note" "$out/graph.err" | head; cat "$out/graph.txt"
HELIOS_PROFILE=1 timeout 120 $B bench graph --samples 10 --dtypes f32,bf16 "$@" > "$out/graph-profile.txt" 2>&1
echo "== HELIOS_PROFILE=1"; grep -E "^(mlp|mixed)" "$out/graph-profile.txt"
HELIOS_FUSION=0 timeout 120 $B bench graph --samples 10 "$@" > "$out/graph-nofusion.txt" 2>&1
echo "== HELIOS_FUSION=0"; grep -E "^(chain|mixed|mlp|host)" "$out/graph-nofusion.txt"
