#!/usr/bin/env bash
# The repository describes the project as it is: its history lives in
# `git log`. Fails, naming each line, when a tracked text file narrates work
# periods ("this session", "earlier sessions"), cites issue numbers or audits.
# Results data (*.json) is not read. The kernels' comments say why the code is
# shaped so and name the benchmark that decided it; the timings themselves
# belong to the benchmark's results, so quoted times in src/ and include/ fail
# too. Exit 77 (skipped) outside a git checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  echo "not a git checkout: nothing to check"
  exit 77
fi
pattern="\\bsessions?\\b|\\bissues? #?[0-9]+|\\bissue's\\b|\\bwork periods?\\b|\\baudit(s|'s)?\\b"
if git grep -n -I -i -E "$pattern" -- ':!*.json' ':!scripts/check_language.sh'; then
  echo "these lines narrate how the project was made; say what holds now (history is in git log)"
  exit 1
fi
timing="[0-9] ?(ms|ns|us)\\b|took [0-9]|\\bat N = [0-9]|Mcycles|GFLOP/s"
if git grep -n -I -E "$timing" -- src include; then
  echo "these source lines quote timings; name the benchmark that decided the shape instead"
  exit 1
fi
echo "no narrative of work periods, issues or audits in the tracked files; no timings in the sources"
