#!/usr/bin/env bash
# Configures and builds the project (Release) into ./build, after installing any
# missing Debian packages. Extra arguments go to CMake's configure step;
# MHLA_BUILD_TARGETS, if set, names the targets to build (default: all).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
# The CUDA backend is compiled wherever the CUDA toolkit is (its tests skip
# without a GPU; see docs/cuda.md).
cuda=()
nvcc=$(command -v nvcc || true)
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
[ -n "$nvcc" ] && cuda=(-DMHLA_WITH_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc")
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "${cuda[@]}" "$@" > /dev/null
targets=()
[ -n "${MHLA_BUILD_TARGETS:-}" ] && targets=(--target $MHLA_BUILD_TARGETS)
cmake --build build -j "$(nproc)" "${targets[@]}"
