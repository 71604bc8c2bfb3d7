#!/usr/bin/env bash
# Installs the system packages Helios needs, or says exactly what to install.
# Usage: scripts/deps.sh run|test
#   run:  the Vulkan loader and a Vulkan driver (lavapipe, for machines without a GPU driver)
#   test: also the Khronos validation layer and spirv-tools (spirv-val)
set -euo pipefail

need=(libvulkan1 mesa-vulkan-drivers)
if [ "${1:-run}" = test ]; then
  need+=(vulkan-validationlayers spirv-tools)
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "error: cargo not found. Install Rust first: https://rustup.rs (curl https://sh.rustup.rs -sSf | sh)" >&2
  exit 1
fi

if ! command -v dpkg >/dev/null 2>&1; then
  echo "note: not a Debian/Ubuntu system; make sure these are installed: ${need[*]}" >&2
  exit 0
fi

missing=()
for p in "${need[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing: ${missing[*]}" >&2
if [ "$(id -u)" = 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
else
  echo "error: missing packages. Run: sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
