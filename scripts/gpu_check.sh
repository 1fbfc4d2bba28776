#!/usr/bin/env bash
# The GPU checks in one call: builds the library with the CUDA backend and
# nothing else of the project (-DMHLA_BUILD_TOOLS=OFF), runs the CUDA tests
# (and compute-sanitizer's racecheck and synccheck on three small cases, where
# the machine has it) and the CUDA benchmark; then, time permitting, builds the Python package
# for the machine's python3 (its torch), with the CUDA backend, and runs
# bench/gpu_check.py: the tests of mhla.torch's pure-torch path and of CUDA
# tensors through mhla.forward/backward on the device, then the timings. Where the machine lacks the Debian
# packages, the .deb files in gpu-deps/ (scripts/gpu_deps.sh) are unpacked and
# built against. MHLA_GPU_CHECK_PARTS="python" (or "cuda") runs one stage only;
# MHLA_GPU_CHECK_PYTHON replaces the Python stage's script and arguments
# (e.g. "bench/torch_path_profile.py"). So that device time goes to tests and
# timings, MHLA_GPU_CHECK_PARTS=build builds the C++ stage's three programs on
# a machine without a GPU and lists what to carry (under 64 MiB with the
# sources); MHLA_GPU_PREBUILT=1 on the GPU machine runs them as carried.
# Logs and the JSON results go to $OUT (default /tmp/mhla-gpu-check).
#
#   bash scripts/gpu_check.sh [benchmark repeats]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/mhla-gpu-check}
mkdir -p "$out"
# Outside the source tree: the install rules refuse include paths inside it.
root=${MHLA_DEPS_ROOT:-/tmp/mhla-gpu-deps}

if compgen -G "gpu-deps/*.deb" > /dev/null; then
  mkdir -p "$root"
  for deb in gpu-deps/*.deb; do
    if command -v dpkg > /dev/null; then
      dpkg -x "$deb" "$root"
    else
      # A .deb is an ar archive; its files are the data.tar member.
      member=$(ar t "$deb" | grep '^data\.tar')
      case "$member" in
        *.xz) unpack=-J ;;
        *.zst) unpack=--zstd ;;
        *.gz) unpack=-z ;;
        *) unpack= ;;
      esac
      ar p "$deb" "$member" | tar -x $unpack -f - -C "$root"
    fi
  done
  # Absolute links (libz.so -> /lib/...) point into the tree instead.
  find "$root" -type l | while read -r link; do
    target=$(readlink "$link")
    if [[ "$target" == /* && -e "$root$target" ]]; then ln -sfn "$root$target" "$link"; fi
  done
fi

lib=$root/usr/lib/x86_64-linux-gnu
export LD_LIBRARY_PATH="$lib/openblas-openmp:$lib:$root/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt" || true
fi
status=0

# MHLA_GPU_CHECK_PARTS picks the stages: "build" (the C++ stage's programs
# only), "cuda" (the C++ backend), "python" (the torch path).
# Carried programs (MHLA_GPU_PREBUILT=1) serve the C++ stage only: the Python
# stage still configures and builds build-gpu/ here, for this machine's own
# interpreter (no CMake cache travels with the programs).
parts=" ${MHLA_GPU_CHECK_PARTS:-cuda python} "
# One build tree for both stages: the Python package links the library the
# first stage compiled, CUDA backend included.
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
# One architecture, the card's (H100, H200), to spend device time on tests.
configure=(-S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DMHLA_WITH_CUDA=ON
  -DCMAKE_CUDA_ARCHITECTURES="${MHLA_CUDA_ARCHITECTURES:-90a-real}"
  -DCMAKE_CUDA_COMPILER="$nvcc" -DMHLA_BUILD_TOOLS=OFF -DMHLA_WITH_MPI=OFF
  -DCMAKE_PREFIX_PATH="$root/usr")
programs=(build-gpu/tests/mhla_cuda_tests build-gpu/bench/mhla_cuda_operator_bench
  build-gpu/bench/mhla_cuda_state_kernel_bench)
build_programs() {
  echo "== configure (logs: $out) =="
  if ! cmake "${configure[@]}" -DMHLA_BUILD_PYTHON=OFF > "$out/configure.log" 2>&1; then
    tail -40 "$out/configure.log"
    exit 1
  fi
  echo "== build =="
  if ! cmake --build build-gpu -j "$(nproc)" --target "${programs[@]##*/}" > "$out/build.log" 2>&1; then
    grep -m 30 -A 6 -E "error|Error" "$out/build.log"
    exit 1
  fi
}
if [[ "$parts" == " build " ]]; then
  build_programs
  # The programs link OpenBLAS, Highway and zlib dynamically: gpu-deps/ travels with them,
  # fetched again so that a folder from an older list gains the packages added since.
  bash scripts/gpu_deps.sh > /dev/null
  du -cb "${programs[@]}" gpu-deps | tail -1 |
    awk '{ printf "to carry: %.1f MiB besides the sources\n", $1 / 2^20 }'
  echo "carry: ${programs[*]} gpu-deps"
  echo "there: MHLA_GPU_PREBUILT=1 bash scripts/gpu_check.sh"
  exit 0
fi
if [[ "$parts" == *" cuda "* ]]; then
  # MHLA_GPU_PREBUILT=1: the programs were built elsewhere and carried here,
  # so that device time goes to tests and timings.
  if [[ "${MHLA_GPU_PREBUILT:-0}" == 1 ]]; then
    echo "== prebuilt: $(ls "${programs[@]}") =="
  else
    build_programs
  fi

  echo "== tests =="
  ./build-gpu/tests/mhla_cuda_tests --gtest_brief=1 > "$out/tests.log" 2>&1 || status=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests? ran" "$out/tests.log" | tail -20
  grep -m 40 -B 1 -A 8 "Failure" "$out/tests.log" || true

  echo "== benchmark =="
  ./build-gpu/bench/mhla_cuda_operator_bench "${1:-5}" "$out/operator.json" | tee "$out/bench.txt" || status=1
  echo "== the bfloat16-state kernels one by one =="
  ./build-gpu/bench/mhla_cuda_state_kernel_bench 20 "$out/state-kernels.json" |
    tee "$out/state-kernels.txt" || status=1
fi
if [[ "$parts" == *" python "* ]]; then
  echo "== the Python package on CUDA tensors (bench/gpu_check.py) =="
  py=$(command -v python3)
  if ((SECONDS > ${MHLA_PYTHON_STAGE_BEFORE:-300})); then
    echo "skipped: ${SECONDS} s gone (it starts only before ${MHLA_PYTHON_STAGE_BEFORE:-300} s)"
  elif pybind=$("$py" -m pybind11 --cmakedir 2> /dev/null) &&
    cmake "${configure[@]}" -DMHLA_BUILD_PYTHON=ON -DPython_EXECUTABLE="$py" \
      -Dpybind11_DIR="$pybind" > "$out/configure-python.log" 2>&1 &&
    cmake --build build-gpu -j "$(nproc)" --target mhla_python > "$out/build-python.log" 2>&1; then
    read -ra script <<< "${MHLA_GPU_CHECK_PYTHON:-bench/gpu_check.py --json $out/gpu-check.json --workers 4 \
--dispatch-table $out/_cuda_dispatch.py}"
    PYTHONPATH=$PWD/build-gpu/python "$py" "${script[@]}" 2>&1 | tee "$out/gpu-check.txt" || status=1
  else
    echo "the Python package did not build (logs: $out/configure-python.log, $out/build-python.log)"
    tail -20 "$out/configure-python.log" "$out/build-python.log" 2> /dev/null || true
  fi
fi
# Races and barrier misuse the value checks cannot see, on a few small cases of the tensor-core
# kernels (each run under the tool is 10-100x slower), where the machine has the tool; last, so
# that what it costs never keeps the timings from running.
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [[ "$parts" == *" cuda "* && -x "$sanitizer" ]]; then
  small='*CudaBf16State*1d_ragged_narrow_causal_elu1_normalized_shared'
  small+=':*CudaBf16State*2d_ragged_wide_block_causal_relu_normalized_per_head'
  small+=':*CudaBf16Backward*1d_ragged_three_chunk_blocks_causal_elu1_normalized_shared'
  for tool in racecheck synccheck; do
    echo "== compute-sanitizer --tool $tool =="
    timeout 60 "$sanitizer" --tool "$tool" --error-exitcode 9 ./build-gpu/tests/mhla_cuda_tests \
      --gtest_brief=1 --gtest_filter="$small" > "$out/sanitizer-$tool.log" 2>&1 || status=1
    grep -E "ERROR SUMMARY|tests? ran|FAILED" "$out/sanitizer-$tool.log" | tail -4
  done
elif [[ "$parts" == *" cuda "* ]]; then
  echo "== compute-sanitizer: not on this machine =="
fi
exit $status
