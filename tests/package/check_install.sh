#!/usr/bin/env bash
# Installs a finished build into a scratch prefix and uses it the two ways a
# downstream project would: find_package(mhla) from a CMake project, and a
# plain compile through pkg-config. Both consumers must run and agree with the
# reference. Usage: check_install.sh BUILD_DIR SOURCE_DIR VERSION
set -euo pipefail
build=$1 source=$2 version=$3
work=$build/package_check
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix

cmake --install "$build" --prefix "$prefix" > "$work/install.log"
for f in include/mhla/mhla.hpp include/mhla/version.hpp; do
  test -f "$prefix/$f" || { echo "not installed: $f"; exit 1; }
done
# "mhla VERSION (OpenBLAS ..., CORE kernels)"
installed_version=$("$prefix/bin/mhla" --version)
[[ $installed_version == "mhla $version (OpenBLAS "*" kernels)" ]] ||
  { echo "mhla --version printed '$installed_version', expected mhla $version (OpenBLAS ...)"; exit 1; }

echo "== find_package(mhla $version EXACT) =="
cmake -S "$source/tests/package/consumer" -B "$work/cmake" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DMHLA_VERSION_WANTED="$version" > "$work/configure.log"
cmake --build "$work/cmake" > "$work/build.log"
"$work/cmake/consumer" "$version"

echo "== a version the package is not compatible with is refused =="
if cmake -S "$source/tests/package/consumer" -B "$work/cmake-wrong-version" \
    -DCMAKE_PREFIX_PATH="$prefix" -DMHLA_VERSION_WANTED=99.0 > "$work/wrong-version.log" 2>&1; then
  echo "find_package(mhla 99.0) succeeded against $version"
  exit 1
fi
grep -q "version: $version" "$work/wrong-version.log"
echo "refused, naming version $version"

echo "== pkg-config =="
pc=$(find "$prefix" -name mhla.pc)
test -n "$pc" || { echo "mhla.pc not installed"; exit 1; }
export PKG_CONFIG_PATH=$(dirname "$pc")
test "$(pkg-config --modversion mhla)" = "$version"
# shellcheck disable=SC2046  # the flags are words
g++ -std=c++20 -O1 "$source/tests/package/consumer/main.cpp" -o "$work/pkg-config-consumer" \
  $(pkg-config --cflags --libs mhla)
"$work/pkg-config-consumer" "$version"
