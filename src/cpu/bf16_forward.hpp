#pragma once
// The forward pass on bfloat16 q, k, v and o, with the block products on
// bfloat16 operands and float32 sums (cpu/simd/bf16_products.hpp): phi(K_b)
// and phi(Q_i) are computed in float and rounded to bfloat16 as the products
// read them, the summaries and the normalisers stay float, and o is rounded
// once to bfloat16. The phases are ChunkedAttention's; only their operands
// change:
//   1. [S_b | z_b]: S_b = phi(K_b)^T V_b on pairs of tokens, z_b in float
//   2. the mixer's mix_bf16; keeping neither array, the dense mix reads the
//      summaries as pairs of blocks that phase 1 writes rounded (no float
//      array, no packing)
//   3. y = phi(Q_i) S~_i on pairs of key features, den = phi(Q_i) z~_i in float
// Not for causal problems (their in-block triangle products are float only)
// nor without simd::bf16_products_available(): the operator then widens the
// inputs and runs the float kernels.
#include "core/validate.hpp"
#include "cpu/mixer.hpp"
#include "mhla/bfloat16.hpp"

namespace mhla::cpu {

class Bf16Forward {
 public:
  Bf16Forward(const mhla::detail::Problem& problem, const Mixer<float>& mixer);

  // As ChunkedAttention<float>::forward: summaries_out and mixed_out, when
  // given, keep the float [B*H, M, Dk*(Dv+1)] summaries for backward; returns
  // whether every output is finite.
  bool forward(const bfloat16* q, const bfloat16* k, const bfloat16* v, bfloat16* o,
               float* summaries_out = nullptr, float* mixed_out = nullptr) const;

 private:
  // Into `summaries` (float), or with `pairs` instead (summaries null) as the
  // dense bfloat16 mix reads them (Mixer::mix_summary_pairs):
  // [B*H, (M + 1) / 2, Dk (Dv + 1)] pairs of bfloat16 halves.
  void compute_summaries(const bfloat16* k, const bfloat16* v, float* summaries,
                         uint16_t* pairs) const;
  bool compute_outputs(const bfloat16* q, const float* mixed, bfloat16* o) const;

  mhla::detail::Problem p_;
  const Mixer<float>& mixer_;
  int64_t x1_;         // Dv + 1 columns of a summary
  int64_t max_rows_;   // largest block
  int64_t row_pairs_;  // pairs of rows of the largest block
  int64_t dk_pairs_;   // pairs of key features
};

}  // namespace mhla::cpu
