#!/usr/bin/env bash
# The Python package as a user installs it: builds the wheel with Debian's
# build tools (python3 -m build, no network, hence --no-isolation), installs
# it into a fresh virtual environment outside the source tree (seeing
# Debian's torch and NumPy), and runs the Python tests against that install.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
bash scripts/install-deps.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

/usr/bin/python3 -m build --wheel --no-isolation --outdir "$work/wheels" . > "$work/build.log" 2>&1 ||
  { tail -50 "$work/build.log"; exit 1; }
ls "$work/wheels"
/usr/bin/python3 -m venv --system-site-packages "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --no-index "$work/wheels"/mhla-*.whl
cd "$work"
"$work/venv/bin/python" -c 'import mhla; print("installed mhla", mhla.__version__, "at", mhla.__file__)'
MHLA_TEST_INSTALLED=1 "$work/venv/bin/python" -m pytest -q -p no:cacheprovider "$repo/python/tests"
