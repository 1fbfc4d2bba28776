#pragma once
// The backward pass on bfloat16 q, k, v and grad_o, reading the bfloat16
// tensors in place and writing each gradient rounded once, with every block
// product on bfloat16 operands and float32 sums (cpu/simd/bf16_products.hpp).
// The phases are ChunkedAttention's backward; only their operands change:
//   0. the summaries (saved, or recomputed by ChunkedAttention from the
//      widened tokens) and the float mix
//   1. the read-out's backward: dphi(Q) = dy S~_i^T + dy[Dv] z~_i^T and
//      dS~_i = phi(Q)^T dy, dy = [g / den | -(g . o) / den] as pairs
//   2. the mixer's mix_backward_bf16
//   3. the summaries' backward: dphi(K) = V dS^T + 1 dz^T, dV = phi(K) dS
// Not for causal problems (their in-block triangle products are float only)
// nor without simd::bf16_products_available(): the operator then widens the
// inputs and runs the float kernels.
#include "core/validate.hpp"
#include "cpu/chunked_attention.hpp"
#include "cpu/mixer.hpp"
#include "mhla/bfloat16.hpp"

namespace mhla::cpu {

class Bf16Backward {
 public:
  // kernel recomputes the summaries where backward is given none.
  Bf16Backward(const mhla::detail::Problem& problem, const Mixer<float>& mixer,
               const ChunkedAttention<float>& kernel);

  // As ChunkedAttention<float>::backward, on bfloat16 token tensors.
  bool backward(const bfloat16* q, const bfloat16* k, const bfloat16* v, const bfloat16* grad_o,
                bfloat16* grad_q, bfloat16* grad_k, bfloat16* grad_v, float* grad_w,
                const float* saved_summaries = nullptr, const float* saved_mixed = nullptr) const;

 private:
  // Phase 1: grad_q, and the gradient of `mixed` into mixed_grad (which may
  // be `mixed` itself: each block is read before it is overwritten).
  bool output_gradients(const bfloat16* q, const bfloat16* grad_o, const float* mixed,
                        float* mixed_grad, bfloat16* grad_q) const;
  // Phase 3: grad_k and grad_v from the summaries' gradient.
  bool key_value_gradients(const bfloat16* k, const bfloat16* v, const float* summaries_grad,
                           bfloat16* grad_k, bfloat16* grad_v) const;

  mhla::detail::Problem p_;
  const Mixer<float>& mixer_;
  const ChunkedAttention<float>& kernel_;
  int64_t x1_;        // Dv + 1 columns of a summary
  int64_t x_;         // Dk * (Dv + 1): one summary
  int64_t max_rows_;  // largest block
};

}  // namespace mhla::cpu
