#pragma once
// One decoding step of one (sequence, head) on the streaming decoder's state,
// as a SIMD kernel (compiled for every x86 instruction set, chosen at run
// time like cpu/simd/block_gemm.hpp). The state rows are [Dk, Dv + 1]: a
// block summary [S | z] with the key sums as the last column.
#include <cstdint>

namespace mhla::cpu::simd {

// running[a, :] += kap[a] [v | 1]     (the token joins its block's summary)
// y[e] = sum_a u[a] (prefix[a, e] + wii running[a, e])   for e < Dv
// returns the same sum for the key-sum column e = Dv: the denominator
// before eps. kap = phi(k_t), u = phi(q_t), both [Dk]; v and y are [Dv].
float decode_token(int64_t dk, int64_t dv, const float* kap, const float* v, const float* u,
                   float wii, const float* prefix, float* running, float* y);

}  // namespace mhla::cpu::simd
