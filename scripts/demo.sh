#!/usr/bin/env bash
# The main job: install, build, run `mhla demo` on built-in synthetic data, then
# a short training comparison of softmax, linear attention and MHLA with the lab
# (`mhla-lab compare --preset quick`: byte-level text, 784-token Fashion-MNIST
# and MQAR recall).
# Arguments go to `mhla demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
# Only the two programs and what they link: the rest is built by the tests.
MHLA_BUILD_TARGETS=mhla_cli MHLA_LAB_TARGETS=mhla_lab bash scripts/build.sh
./build/tools/mhla demo "$@"
echo
./build/experiments/mhla-lab compare --preset quick --out compare-quick
