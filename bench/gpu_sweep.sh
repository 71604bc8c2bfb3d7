#!/usr/bin/env bash
# Element-wise tuning sweep on the GPU machine: vec4s per invocation x workgroup size, f32
# and f16 bandwidth, plus the dispatch suite. Usage: bench/gpu_sweep.sh OUTDIR
set -uo pipefail
out=${1:?output dir}
for f in .gl/*.deb; do dpkg -x "$f" / 2>/dev/null; done; ldconfig
B=target/release/helios
$B info >/dev/null 2>&1 || export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
for v in 1 2 4; do for wg in 256 512 1024; do
  echo "== HELIOS_EW_VECS=$v HELIOS_WG=$wg"
  HELIOS_EW_VECS=$v HELIOS_WG=$wg $B bench bandwidth --json "$out/sweep-v$v-wg$wg.json" > "$out/sweep-v$v-wg$wg.txt" 2>&1
  grep -E "^(add|copy|exp) " "$out/sweep-v$v-wg$wg.txt" | awk '{print $1, $2, $3, $(NF-3), $(NF-1)}' | tr '\n' ';'; echo
done; done
echo "== dispatch"; $B bench dispatch 2>&1 | grep -E "^(roundtrip|chain|independent) "
