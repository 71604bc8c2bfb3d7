#!/usr/bin/env bash
# Runs the engine's integration tests (release builds carried in .gpu/) on the GPU machine,
# which has no validation layer: results are still checked against the CPU reference.
set -uo pipefail
out=${1:?output dir}
for t in .gpu/t_*; do
  echo "== $t"; HELIOS_VALIDATION=0 "$t" --test-threads 1 2>&1 | tail -4 | tee -a "$out/tests.txt"
done
