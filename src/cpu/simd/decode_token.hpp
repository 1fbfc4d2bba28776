#pragma once
// One decoding step of one (sequence, head) on the streaming decoder's state,
// as a SIMD kernel (compiled for every x86 instruction set, chosen at run
// time like cpu/simd/block_gemm.hpp).
#include <cstdint>

namespace mhla::cpu::simd {

// How the decoder keeps a block summary [S | z] (S [Dk, Dv], z [Dk]) in
// memory: Dk rows of S, each padded to `row` floats, then z padded to
// `z_floats`. Both paddings are multiples of 16 floats and stay zero, so in
// 64-byte aligned storage every row starts a cache line and the kernel reads
// whole vectors without masks. (Rows of Dv + 1 floats with z as the last
// column, the operator's layout, put most vector loads across two cache
// lines, and mhla_decode_bench's step ran slower.)
struct StateLayout {
  int64_t dk, dv;
  int64_t row;       // Dv rounded up to 16
  int64_t z_floats;  // Dk rounded up to 16
  int64_t floats;    // dk * row + z_floats

  StateLayout(int64_t dk, int64_t dv);
  // From and to the operator's [Dk, Dv + 1] summary (z as the last column).
  void store(const float* summary, float* stored) const;
  void load(const float* stored, float* summary) const;
};

// With running and prefix in `layout` (64-byte alignment is for speed only):
// running[a, :] += kap[a] [v | 1]     (the token joins its block's summary)
// y[e] = sum_a u[a] (prefix[a, e] + wii running[a, e])   for e < Dv
// returns the same sum over the key sums z: the denominator before eps.
// kap = phi(k_t), u = phi(q_t), both [Dk]; v and y are [Dv].
float decode_token(const StateLayout& layout, const float* kap, const float* v, const float* u,
                   float wii, const float* prefix, float* running, float* y);

}  // namespace mhla::cpu::simd
