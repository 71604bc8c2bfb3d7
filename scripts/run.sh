#!/usr/bin/env bash
# The main job: train the `tiny` GPT-2 preset (4 layers, 128 channels, GPT-2's 50,257-token
# vocabulary, 7.2M parameters) on the bundled Shakespeare on the best Vulkan device
# (lavapipe on a machine without a GPU; HELIOS_DEVICE picks another), then print a sample.
# - On lavapipe, `helios train`'s defaults: 40 steps of 4x64 tokens, learning rate 2e-3 with
#   4 warm-up steps, cosine to 2e-4. They take 3 to 7 minutes on 2 idle CPU cores, depending
#   on the CPU (see the README), and bring the validation loss from 10.83 to 6.78.
# - On a GPU, 1500 steps of 32x128 tokens, long enough that the sample reads like the
#   corpus: on an H200 47 s of training (validation loss 4.07) after up to a minute of
#   choosing kernels on a first run (bench/results/2026-11-29-run-sh-gpu-h200-log.csv).
# Extra arguments replace these and go to `helios train` (e.g. `scripts/run.sh --steps 500
# --batch 8`; see `helios train --help`). Writes out/train/: checkpoint/, log.json,
# log.csv, loss.png. Installs missing system packages first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh run
# `cargo run` finds the binary wherever the target directory is (CARGO_TARGET_DIR included).
helios() { cargo run --release -q -p helios-cli -- "$@"; }
if [ $# -eq 0 ]; then
    # The selected device's type, as `helios info` prints it.
    type=$(helios info 2>/dev/null | awk '/<- selected/ { s = 1 } s && $1 == "type" { print $2; exit }')
    case "$type" in
        discrete_gpu | integrated_gpu | virtual_gpu)
            echo "run.sh: the device is a GPU ($type): training 1500 steps of 32x128 tokens so that" \
                "the sample reads like the corpus (arguments replace this)"
            set -- --steps 1500 --batch 32 --seq 128 --eval-every 300
            ;;
    esac
fi
exec cargo run --release -q -p helios-cli -- train "$@"
