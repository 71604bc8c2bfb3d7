#!/usr/bin/env bash
# Clock/P-state trace around a command on the GPU machine: samples nvidia-smi every 50 ms
# into OUTDIR/clocks.csv while the command runs, and marks start/end in OUTDIR/marks.txt.
# Usage (repo root, device machine): bench/gpu_clocks.sh OUTDIR LABEL cmd args...
set -uo pipefail
out=${1:?output dir}; label=${2:?label}; shift 2
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,pstate,power.draw,utilization.gpu,clocks_throttle_reasons.active \
  --format=csv,noheader -lms 50 >> "$out/clocks.csv" 2>/dev/null &
smi=$!
echo "$(date +%H:%M:%S.%N) start $label" >> "$out/marks.txt"
"$@"; rc=$?
echo "$(date +%H:%M:%S.%N) end $label rc=$rc" >> "$out/marks.txt"
kill $smi 2>/dev/null; wait $smi 2>/dev/null
exit $rc
