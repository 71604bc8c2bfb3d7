#!/usr/bin/env bash
# Host cost of the lazy graph on the GPU machine, split the way the probes split it here:
# `chain_probe` (building and realising 1000-op chains per op, one-node realisations, and
# mixed32's step) and `step_probe` (a 12-block step's recording time and allocations). The
# same binaries on lavapipe here give the comparison: if building (no driver in it) is as
# much slower there as the whole step, that host's CPU is the cause, not the driver.
# Build here: cargo build --release -p helios --example chain_probe --example step_probe,
# then strip both into .gpu/ (carried).
# Usage (repo root, device machine): bench/gpu_host.sh OUTDIR
set -uo pipefail
out=${1:?output dir}
for f in .gl/*.deb; do dpkg -x "$f" / 2>/dev/null; done; ldconfig
if [ -x .gpu/helios ] && ! .gpu/helios info >/dev/null 2>&1; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
export HELIOS_VALIDATION=0
lscpu | grep -E "Model name|MHz|^CPU\(s\)" | tee "$out/host.txt"
ROUNDS=5 timeout 120 .gpu/chain_probe 2>&1 | tee -a "$out/host.txt"
STEPS=12 timeout 120 .gpu/step_probe 2>&1 | tail -6 | tee -a "$out/host.txt"
