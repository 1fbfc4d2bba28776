#!/usr/bin/env bash
# Configures and builds the project (Release) into ./build, after installing any
# missing Debian packages. Extra arguments go to CMake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release "$@" > /dev/null
cmake --build build -j "$(nproc)"
