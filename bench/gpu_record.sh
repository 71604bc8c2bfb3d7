#!/usr/bin/env bash
# The recorded run for bench/results: info, self-check, both benchmark suites beside PyTorch
# (cold pipeline cache, then warm), and the push-descriptor binding model.
# Usage (repo root, on the GPU machine): bench/gpu_record.sh OUTDIR
set -uo pipefail
out=${1:?output dir}
for f in .gl/*.deb; do dpkg -x "$f" / 2>/dev/null; done; ldconfig
B=target/release/helios
$B info >/dev/null 2>&1 || export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export HELIOS_CACHE_DIR=$(mktemp -d)
$B info > "$out/info.txt" 2>&1
$B selfcheck > "$out/selfcheck.txt" 2>&1; tail -1 "$out/selfcheck.txt"
$B bench all --compare torch --json "$out/bench.json" > "$out/bench.txt" 2>&1
grep -v "^bench: \(bandwidth\|dispatch\|running\|wrote\)" "$out/bench.txt"
echo "== warm pipeline cache"; $B bench dispatch --samples 3 --ops 100 2>&1 | grep "pipelines created"
echo "== HELIOS_BINDING=descriptor"
HELIOS_BINDING=descriptor $B bench all --json "$out/bench-descriptor.json" > "$out/bench-descriptor.txt" 2>&1
grep -E "^(roundtrip|chain_batched|independent|copy|add|exp) " "$out/bench-descriptor.txt"
