#!/usr/bin/env bash
# The main job: install, build, then run `mhla demo` on built-in synthetic data.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
./build/tools/mhla demo "$@"
