#!/usr/bin/env bash
# What the bfloat16-state kernels (src/cuda/bf16_state_{forward,mix,backward}.cu)
# compile to, checked without a GPU: their PTX stages through 16-byte
# asynchronous copies into tensor-core products and holds no 2-byte global
# loads and no 64-bit divisions; ptxas, for each architecture the library is
# built for (sm_80, sm_90a), gives every kernel no spills, no stack, at most
# 128 registers a thread (two 256-thread CTAs an SM) and at most 48 KB of
# static shared memory (the backward's sides stage more, in dynamic shared
# memory, sized by static_asserts in bf16_state_backward.cu).
# Usage: check_state_kernel_code.sh NVCC SOURCE_DIR
set -euo pipefail
nvcc=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=(-std=c++17 -I"$src/include" -I"$src/src")
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# check FILE MIN_KERNELS: the PTX and ptxas checks of one file's kernels.
check() {
  local file="$src/src/cuda/$1.cu" expected=$2 kernels=0 name=""
  "$nvcc" "${flags[@]}" -arch=sm_90 -ptx "$file" -o "$work/state.ptx"
  count() { grep -cE "$1" "$work/state.ptx" || true; }
  [ "$(count 'cp\.async\.cg\.shared\.global')" -gt 0 ] || fail "$1: no cp.async copies in the PTX"
  [ "$(count 'wmma\.mma\.sync\.aligned\.[a-z]+\.[a-z]+\.m16n16k16\.f32\.bf16\.bf16\.f32')" -gt 0 ] ||
    fail "$1: no bfloat16 tensor-core products in the PTX"
  local narrow divisions
  narrow=$(count 'ld\.global(\.nc)?\.(u16|b16|s16)')
  [ "$narrow" -eq 0 ] || fail "$1: $narrow 2-byte global loads in the PTX"
  divisions=$(count '(div|rem)\.[su]64')
  [ "$divisions" -eq 0 ] || fail "$1: $divisions 64-bit divisions in the PTX"

  local arch
  for arch in sm_80 sm_90a; do
    kernels=0
    "$nvcc" "${flags[@]}" -arch=$arch -cubin -Xptxas -v "$file" -o "$work/state.cubin" 2>"$work/ptxas.txt"
    while read -r line; do
      case "$line" in
        *"Compiling entry function"*) name=$(sed -E "s/.*function '([^']*)'.*/\1/" <<<"$line" | c++filt | sed -E 's/.*::([a-z_]+(<[0-9a-z, ]+>)?)\(.*/\1/'); kernels=$((kernels + 1)) ;;
        *"bytes stack frame"*)
          read -r stack spill_stores spill_loads < <(sed -E 's/^([0-9]+) bytes stack frame, ([0-9]+) bytes spill stores, ([0-9]+) bytes spill loads.*/\1 \2 \3/' <<<"$line")
          [ "$stack" -eq 0 ] && [ "$spill_stores" -eq 0 ] && [ "$spill_loads" -eq 0 ] ||
            fail "$arch $name: $line" ;;
        *"Used "*" registers"*)
          registers=$(sed -E 's/.*Used ([0-9]+) registers.*/\1/' <<<"$line")
          shared=$(sed -nE 's/.* ([0-9]+) bytes smem.*/\1/p' <<<"$line")
          [ "$registers" -le 128 ] || fail "$arch $name: $registers registers a thread (at most 128)"
          [ "${shared:-0}" -le 49152 ] || fail "$arch $name: $shared bytes of shared memory (at most 49152)"
          echo "$1 ($arch): $name: $registers registers, ${shared:-0} bytes of static shared memory" ;;
      esac
    done < <(sed -E 's/^ptxas info +: //' "$work/ptxas.txt")
  done
  [ "$kernels" -ge "$expected" ] || fail "$1: ptxas reported $kernels kernels (expected $expected)"
}

check bf16_state_forward 6    # summaries, read-out and causal read-out, two widths each
check bf16_state_mix 4        # the mix both ways, the normalisers' mix, the weight gradient's two
check bf16_state_backward 8   # query side and key and value side, two widths, causal or not
[ "$failures" -eq 0 ] || exit 1
echo "bf16-state kernels pass the code checks"
