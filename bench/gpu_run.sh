#!/usr/bin/env bash
# One call on the GPU machine: info, self-check and the engine benchmarks, both binding
# models, PyTorch side by side. Usage (from the repo root, on the device machine):
#   bench/gpu_run.sh OUTDIR
set -uo pipefail
out=${1:?output dir}
for f in .gl/*.deb; do dpkg -x "$f" / 2>/dev/null; done; ldconfig
B=target/release/helios
$B info >/dev/null 2>&1 || export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export PYTHONUNBUFFERED=1
$B info > "$out/info.txt" 2>&1
$B selfcheck > "$out/selfcheck.txt" 2>&1; tail -1 "$out/selfcheck.txt"
$B bench all --compare torch --json "$out/bench-address.json" > "$out/bench-address.txt" 2>&1
grep -v "^bench:" "$out/bench-address.txt"
HELIOS_BINDING=descriptor $B bench all --json "$out/bench-descriptor.json" > "$out/bench-descriptor.txt" 2>&1
echo "== descriptor"; grep -E "^(roundtrip|chain|independent|add|copy) " "$out/bench-descriptor.txt"
for wg in 128 512 1024; do
  echo "== HELIOS_WG=$wg"; HELIOS_WG=$wg $B bench bandwidth --dtypes f32 > "$out/bench-wg$wg.txt" 2>&1
  grep -E "^(add|copy|exp) " "$out/bench-wg$wg.txt"
done
echo "== profile"; HELIOS_PROFILE=1 $B bench bandwidth --dtypes f32 --json "$out/bench-profile.json" 2>&1 | grep -E "^(case|add|copy|exp) "
