#!/usr/bin/env bash
# The repository describes the project as it is: its history lives in
# `git log`. Fails, naming each line, when a tracked text file narrates work
# periods ("this session", "earlier sessions"), cites issue numbers or audits.
# Results data (*.json) is not read. Exit 77 (skipped) outside a git checkout.
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
echo "no narrative of work periods, issues or audits in the tracked files"
