#!/usr/bin/env bash
# The main job: train the `tiny` GPT-2 preset (4 layers, 128 channels, GPT-2's 50,257-token
# vocabulary, 7.2M parameters) on the bundled Shakespeare on the best Vulkan device
# (lavapipe on a machine without a GPU; HELIOS_DEVICE picks another), then print a sample.
# The defaults (40 steps of 4x64 tokens, learning rate 2e-3 with 4 warm-up steps, cosine to
# 2e-4) take 3 to 7 minutes on lavapipe on 2 idle CPU cores, depending on the CPU (see the
# README), and bring the validation loss from 10.83 to 6.78. Extra
# arguments go to `helios train` (e.g. `scripts/run.sh --steps 500 --batch 8`; see
# `helios train --help`). Writes out/train/: checkpoint/, log.json, log.csv, loss.png.
# Installs missing system packages first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh run
# `cargo run` finds the binary wherever the target directory is (CARGO_TARGET_DIR included).
exec cargo run --release -q -p helios-cli -- train "$@"
