#!/usr/bin/env bash
# The test suite, on the Vulkan device present (lavapipe without a GPU), with the Khronos
# validation layer and synchronization validation on: any validation message fails a test.
# Every generated SPIR-V module goes through the project's spirv-val (.tools/bin, installed by
# scripts/deps.sh test), and every generated PTX module through the project's ptxas (CUDA 12.9,
# .tools/bin, same script; HELIOS_PTXAS overrides it). The MPI backend is built (MPICH, from the
# same script) so that data-parallel training is tested. Runs every crate even when one fails, then
# builds the docs, where any rustdoc warning (a broken intra-doc link, a stray HTML tag) fails the
# run, and ends with one summary line.
# Extra arguments go to `cargo test` (e.g. `scripts/test.sh -p helios -- softmax`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh test
export HELIOS_VALIDATION=1
export HELIOS_SPIRV_VAL="${HELIOS_SPIRV_VAL:-$PWD/.tools/bin/spirv-val}"
export HELIOS_PTXAS="${HELIOS_PTXAS:-$PWD/.tools/bin/ptxas}"
export HELIOS_NVDISASM="${HELIOS_NVDISASM:-$PWD/.tools/bin/nvdisasm}"

log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
cargo test --workspace --features helios-cli/mpi --no-fail-fast "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
# The docs, with the features of the tests (and of .ci/run's clippy): any rustdoc warning fails.
RUSTDOCFLAGS="${RUSTDOCFLAGS:+$RUSTDOCFLAGS }-D warnings" \
  cargo doc --workspace --no-deps --features helios-cli/mpi
doc_status=$?
set -e

# One line per test binary: "test result: ok. 12 passed; 0 failed; 1 ignored; ...".
read -r passed failed ignored binaries < <(awk '
  /^test result:/ { b++; for (i = 1; i <= NF; i++) {
      if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i; if ($(i+1) ~ /^ignored/) g += $i } }
  END { print p+0, f+0, g+0, b+0 }' "$log")
if [ "$doc_status" -eq 0 ]; then docs="docs clean"; else docs="docs FAILED (cargo doc exit $doc_status)"; fi
if [ "$status" -eq 0 ] && [ "$doc_status" -eq 0 ]; then verdict=PASSED; else verdict=FAILED; fi
echo "tests $verdict: $passed passed, $failed failed, $ignored ignored in $binaries test binaries (cargo exit $status); $docs"
if [ "$status" -ne 0 ]; then exit "$status"; fi
exit "$doc_status"
