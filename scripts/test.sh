#!/usr/bin/env bash
# All tests: install, build, run every C++ test with CTest, then the Python
# package's tests with pytest under Debian's interpreter twice: with Debian's
# torch 1.13, and with a current torch from PyPI (scripts/torch2_env.sh, made
# once per machine), where torch.compile and timm are tested too.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
# CTest runs nproc tests at once, each with nproc OpenMP threads (OpenBLAS
# included). Waiting threads that spin starve the other tests' threads (on 2
# cores the suite ran about five times slower with the default policy).
export OMP_WAIT_POLICY=PASSIVE
ctest --test-dir build --output-on-failure -j "$(nproc)"
PYTHONPATH="$PWD/build/python" /usr/bin/python3 -m pytest -q python/tests
torch2_env=$(bash scripts/torch2_env.sh)
PYTHONPATH="$PWD/build/python" "$torch2_env/bin/python" -m pytest -q python/tests
