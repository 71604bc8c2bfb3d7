#!/usr/bin/env bash
# The main job: show every Vulkan device, then run the element-wise self-check on the best
# one (HELIOS_DEVICE picks another). Installs missing system packages first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh run
cargo build --release -q -p helios-cli
target/release/helios info
target/release/helios selfcheck
