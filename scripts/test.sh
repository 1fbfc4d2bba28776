#!/usr/bin/env bash
# All tests: install, build, run every C++ test with CTest (the library's, then
# the lab's in experiments/), then the Python package's tests with pytest under
# Debian's interpreter twice: with Debian's torch 1.13, and with a current torch
# from PyPI (scripts/torch2_env.sh, made once per machine), where torch.compile,
# timm and the lab's Python experiments are tested too.
#
# Prints one line per stage (time, and the tally of its tests); each stage's
# whole output goes to test-logs/STAGE.log (MHLA_TEST_LOGS elsewhere). A
# failing stage prints the end of its log and stops the script.
set -euo pipefail
cd "$(dirname "$0")/.."
logs=${MHLA_TEST_LOGS:-$PWD/test-logs}
mkdir -p "$logs"
echo "full logs: $logs/"

# stage NAME TALLY COMMAND...: runs COMMAND with its output in $logs/NAME.log;
# TALLY is an extended regex for the log line that sums the stage up.
stage() {
  local name=$1 tally=$2
  shift 2
  local log="$logs/$name.log" start=$SECONDS
  if "$@" > "$log" 2>&1; then
    printf '%-18s ok %5d s   %s\n' "$name" $((SECONDS - start)) \
      "$( [[ -n "$tally" ]] && grep -E "$tally" "$log" | tail -1)"
  else
    printf '%-18s FAILED after %d s; the end of %s:\n' "$name" $((SECONDS - start)) "$log"
    tail -n 60 "$log"
    exit 1
  fi
}

stage build "" bash scripts/build.sh
# CTest runs nproc tests at once, each with nproc OpenMP threads (OpenBLAS
# included). Waiting threads that spin starve the other tests' threads (on 2
# cores the suite ran about five times slower with the default policy).
export OMP_WAIT_POLICY=PASSIVE
stage ctest "tests passed" ctest --test-dir build --output-on-failure -j "$(nproc)"
# "100% tests passed" counts the skipped ones: say how many skipped, by suite
# (the CUDA suites without a GPU, the AVX512-BF16 ones on CPUs without it).
skipped=$({ grep "(Skipped)" "$logs/ctest.log" || true; } |
  sed -E 's/^[[:space:]]*[0-9]+ - ([A-Za-z0-9_]+\/)?([A-Za-z0-9_]+)\..*/\2/' | sort | uniq -c |
  awk '{ total += $1; list = list sep $2 " " $1; sep = ", " } END { if (total) print total " (" list ")" }')
if [[ -n "$skipped" ]]; then printf '%-18s    of them skipped: %s\n' "" "$skipped"; fi
stage lab-ctest "tests passed" ctest --test-dir build/experiments --output-on-failure -j "$(nproc)"
export PYTHONPATH="$PWD/build/python"
stage pytest-torch-1.13 " passed" /usr/bin/python3 -m pytest -q python/tests
stage torch-2.11-env "" bash scripts/torch2_env.sh
torch2_env=$(tail -n 1 "$logs/torch-2.11-env.log")
stage pytest-torch-2.11 " passed" "$torch2_env/bin/python" -m pytest -q python/tests
stage lab-pytest " passed" "$torch2_env/bin/python" -m pytest -q experiments/python/tests
