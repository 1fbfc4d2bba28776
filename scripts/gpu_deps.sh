#!/usr/bin/env bash
# Downloads into gpu-deps/ the Debian packages that the library and its CUDA
# tests build against, for a GPU machine that has CUDA, CMake and a C++
# compiler but none of them and no package registry: carry the folder there
# and run scripts/gpu_check.sh, which unpacks them.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p gpu-deps
cd gpu-deps
apt-get download libopenblas-openmp-dev libopenblas0-openmp libopenblas-dev libhwy-dev libhwy1 \
  zlib1g-dev zlib1g libgtest-dev libgmock-dev libdlpack-dev nlohmann-json3-dev
du -sh .
