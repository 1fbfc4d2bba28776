#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (plus ASan and UBSan) into
# ./build-fuzz and fuzzes each for a bounded time: `scripts/fuzz.sh [SECONDS]`
# (default 60 per target). Crashing inputs land in build-fuzz/artifacts/ and the
# script fails.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
bash scripts/install-deps.sh fuzz
CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMHLA_BUILD_FUZZERS=ON -DMHLA_BUILD_PYTHON=OFF \
  -DMHLA_BUILD_TESTS=OFF -DMHLA_BUILD_BENCH=OFF -DMHLA_NATIVE=OFF > /dev/null
targets=(decoder_state npy)
cmake --build build-fuzz -j "$(nproc)" --target write_seeds mhla_library "${targets[@]/%/_fuzz}"
# The lab's checkpoint reader, against that build installed.
cmake --install build-fuzz --component library --prefix build-fuzz/prefix > /dev/null
CXX=clang++ cmake -S experiments -B build-fuzz/experiments -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DMHLA_BUILD_FUZZERS=ON -DMHLA_LAB_BUILD_TESTS=OFF -DMHLA_NATIVE=OFF -DCMAKE_PREFIX_PATH="$PWD/build-fuzz/prefix" > /dev/null
cmake --build build-fuzz/experiments -j "$(nproc)" --target write_safetensors_seeds safetensors_fuzz

mkdir -p build-fuzz/corpus build-fuzz/artifacts
./build-fuzz/fuzz/write_seeds build-fuzz/corpus
./build-fuzz/experiments/write_safetensors_seeds build-fuzz/corpus
for fuzzer in fuzz/decoder_state fuzz/npy experiments/safetensors; do
  target=${fuzzer#*/}
  echo "== fuzzing $target for $seconds s =="
  # One worker thread: OpenMP inside the library stays single-threaded too.
  OMP_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=1 \
    "./build-fuzz/${fuzzer}_fuzz" "build-fuzz/corpus/$target" -max_total_time="$seconds" \
    -timeout=10 -rss_limit_mb=2048 -max_len=8192 -print_final_stats=1 \
    -artifact_prefix="build-fuzz/artifacts/$target-"
done
