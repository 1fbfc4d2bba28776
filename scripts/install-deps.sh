#!/usr/bin/env bash
# Installs the Debian packages the project builds against (see README,
# "Dependencies"). Only missing packages are installed; needs root or sudo.
set -euo pipefail

packages=(
  cmake g++ make pkg-config
  libopenblas-openmp-dev   # BLAS for every GEMM-shaped step, OpenMP flavour
  libhwy-dev               # Google Highway: SIMD kernels with run-time ISA dispatch
  libcli11-dev             # command-line parsing
  nlohmann-json3-dev       # JSON results and safetensors headers
  zlib1g-dev               # CRC-32 of the decoder's state files
  libzip-dev               # .npz archives (mhla forward/backward/analyze)
  libstb-dev               # PNG heatmaps (stb_image_write)
  gnuplot-nox              # PNG plots of mhla bench and the training loss curves
  dataset-fashion-mnist    # the image task of mhla-lab train / mhla-lab compare
  bible-kjv bible-kjv-text # the text task's corpus (KJV) and the program that reads its compressed data
  libgtest-dev libgmock-dev  # unit tests
  python3-numpy            # the CLI test on NumPy's own files; the Python package's NumPy path
  python3-dev pybind11-dev # the Python extension module
  libdlpack-dev            # dlpack.h: zero-copy tensor exchange with torch and NumPy
  python3-torch python3-pytest  # mhla.torch and the Python tests (Debian's torch 1.13)
  python3-venv python3-pip      # pip install . and the wheel in fresh environments (scripts/test_wheel.sh)
  libopenmpi-dev openmpi-bin    # context parallelism over MPI (mpirun for its tests)
)
# `install-deps.sh fuzz` adds what the libFuzzer targets need (scripts/fuzz.sh).
if [[ "${1:-}" == "fuzz" ]]; then
  packages+=(clang libomp-dev)  # libFuzzer and clang's OpenMP runtime
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
echo "installing missing Debian packages: ${missing[*]}"
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
