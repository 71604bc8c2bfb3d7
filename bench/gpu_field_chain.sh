#!/usr/bin/env bash
# The Montgomery multiplier's throughput (chain probe, 256 dependent products per element at
# n = 4M, kernel only) of the product-scanning layouts on the GPU machine, with the chain's
# intermediate products kept below 2p (the default) and made canonical at every step
# (HELIOS_FIELD_CHAIN_CANONICAL=1), under an nvidia-smi clock/power trace (clocks.csv,
# marks.txt). Also saves the driver's pipeline cache (cache*/): its zstd frames hold the SASS
# that `nvdisasm -b SM90` reads (see the session-4 note).
# Usage (repo root, device machine, target/release/helios carried):
#   L=layouts WG=workgroups BUDGET=seconds bench/gpu_field_chain.sh OUTDIR
set -uo pipefail
out=${1:?output dir}
for f in .gl/*.deb; do dpkg -x "$f" / 2>/dev/null; done; ldconfig
B=target/release/helios
$B info >/dev/null 2>&1 || export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
L=${L:-comba30k2h,comba30kh}
for canonical in 0 1; do
  echo "== HELIOS_FIELD_CHAIN_CANONICAL=$canonical" | tee -a "$out/chain.txt"
  HELIOS_FIELD_CHAIN_CANONICAL=$canonical HELIOS_CACHE_DIR="$out/cache$canonical" HELIOS_PIPELINE_STATS=1 \
    bench/gpu_clocks.sh "$out" "canonical=$canonical $L" \
    $B field bench --sweep --sweep-workgroups "${WG:-128}" --sweep-layouts "$L" \
    --budget "${BUDGET:-1}" --sizes 64 --ops add --json "$out/chain$canonical.json" 2>&1 \
    | grep -E "stats fq_mul_chain|mul-chain" \
    | sed 's/, Stack Size=0, Local Memory Size=68719476736, Shared Memory Size=0//' | tee -a "$out/chain.txt"
done
