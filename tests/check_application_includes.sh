#!/usr/bin/env bash
# The lab (experiments/: the trainer, mhla-lab), the mhla program, the
# examples and the Python bindings (python/) are applications of the library: they see its public API (include/mhla), the support utilities
# (support/mhla_support) and their own headers, never the library's private
# src/. Fails naming each include, or build rule, that reaches further.
# Usage: check_application_includes.sh SOURCE_DIR
set -euo pipefail
cd "$1"
apps=(experiments tools examples python)
bad=$(grep -rnE '^#include "' "${apps[@]}" --include='*.cpp' --include='*.hpp' |
  grep -vE '#include "(mhla|mhla_support|train|common)/[a-z0-9_]+\.hpp"|#include "[a-z0-9_]+\.hpp"' || true)
rules=$(grep -rnE 'PROJECT_SOURCE_DIR\}/src|\.\./src' "${apps[@]}" --include=CMakeLists.txt || true)
if [[ -n "$bad$rules" ]]; then
  echo "applications reaching past the library's public API:"
  [[ -n "$bad" ]] && echo "$bad"
  [[ -n "$rules" ]] && echo "$rules"
  exit 1
fi
echo "experiments/, tools/, examples/ and python/ include only mhla/, mhla_support/ and their own headers"
