#!/usr/bin/env bash
# The main job: install, build, run `mhla demo` on built-in synthetic data, then
# a short training comparison of softmax, linear attention and MHLA
# (`mhla compare --preset quick`: byte-level text, 784-token Fashion-MNIST and
# MQAR recall).
# Arguments go to `mhla demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
# Only the mhla program and what it links: the rest is built by the tests.
MHLA_BUILD_TARGETS=mhla_cli bash scripts/build.sh
./build/tools/mhla demo "$@"
echo
./build/tools/mhla compare --preset quick --out compare-quick
