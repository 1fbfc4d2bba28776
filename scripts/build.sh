#!/usr/bin/env bash
# Configures and builds the project (Release) into ./build, after installing any
# missing Debian packages, then the lab (experiments/) into ./build/experiments
# against the library installed into ./build/prefix. Extra arguments go to the
# library's CMake configure step; MHLA_BUILD_TARGETS and MHLA_LAB_TARGETS, if
# set, name the targets to build (default: all).
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
[ -n "${MHLA_BUILD_TARGETS:-}" ] && targets=(--target $MHLA_BUILD_TARGETS mhla_library)
cmake --build build -j "$(nproc)" "${targets[@]}"

# The lab uses the library as any project would: find_package(mhla) on the
# installed package (the `library` component: headers, static libraries, the
# CMake config).
cmake --install build --component library --prefix build/prefix > /dev/null
cmake -S experiments -B build/experiments -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$PWD/build/prefix" > /dev/null
lab_targets=()
[ -n "${MHLA_LAB_TARGETS:-}" ] && lab_targets=(--target $MHLA_LAB_TARGETS)
cmake --build build/experiments -j "$(nproc)" "${lab_targets[@]}"
