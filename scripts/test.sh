#!/usr/bin/env bash
# The test suite, on the Vulkan device present (lavapipe without a GPU), with the Khronos
# validation layer and synchronization validation on: any validation message fails a test.
# Every generated SPIR-V module goes through spirv-val. Installs missing system packages first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh test
HELIOS_VALIDATION=1 cargo test --workspace "$@"
