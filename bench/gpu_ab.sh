#!/usr/bin/env bash
# A/B on the GPU machine, one call: the same `helios bench` command with two binaries, run
# alternately (A B A B) with one cache directory, so both see the same tuning store and
# clocks, and machine-to-machine drift cancels out. Stripped binaries fit the carry limit:
#   strip -o .bin/helios-a <old build>; strip -o .bin/helios-b target/release/helios
# Usage (repo root, on the device machine): bench/gpu_ab.sh OUTDIR ROUNDS bench-args...
set -uo pipefail
out=${1:?output dir}; rounds=${2:?rounds}; shift 2
for f in .gl/*.deb; do dpkg -x "$f" / 2>/dev/null; done; ldconfig
.bin/helios-b info >/dev/null 2>&1 || export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export PYTHONUNBUFFERED=1 HELIOS_CACHE_DIR=${HELIOS_CACHE_DIR:-/tmp/helios-cache}
name=$(echo "$*" | tr -c 'a-z0-9' '_' | cut -c1-40)
for r in $(seq 1 "$rounds"); do
  for v in b a; do
    log="$out/$name-$v$r.txt"
    timeout 300 ".bin/helios-$v" bench "$@" > "$log" 2>&1
    echo "== $v round $r (rc=$?): $*"; grep -vE "^(bench:|note)" "$log" | tail -12
  done
done
