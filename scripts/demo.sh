#!/usr/bin/env bash
# The main job: install, build, run `mhla demo` on built-in synthetic data, then
# a short training comparison of softmax, linear attention and MHLA
# (`mhla compare --preset quick`: byte-level text, 784-token Fashion-MNIST and
# MQAR recall, under 5 minutes on 2 cores).
# Arguments go to `mhla demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
./build/tools/mhla demo "$@"
echo
./build/tools/mhla compare --preset quick --out compare-quick
