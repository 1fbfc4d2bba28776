#pragma once
// The CPU's chunked kernels (cpu/chunked_attention.hpp) with the mixer of W
// (cpu/mixer.hpp), as the backend's operator and as its phases.
#include <memory>

#include "backend/backend.hpp"
#include "cpu/chunked_attention.hpp"
#include "cpu/mixer.hpp"
#include "cpu/workspace.hpp"

namespace mhla::cpu {

// The mixer of w, or the all-ones mix of linear attention for w == nullptr.
template <typename T>
std::unique_ptr<Mixer<T>> mixer_of(const detail::Problem& p, const T* w) {
  if (w == nullptr) return std::make_unique<UniformMixer<T>>(p);
  return make_mixer(p, w);
}

// The CPU's kernels of one problem and its W: the operator (the backend's
// Attention) and each of its phases, which the entry points that run on the
// CPU only (the phase functions, forward_piece) call.
template <typename T>
class CpuAttention final : public backend::Attention<T> {
 public:
  CpuAttention(const detail::Problem& p, const T* w)
      : p_(p), mixer_(mixer_of(p, w)), kernel_(p_, *mixer_) {}

  bool forward(const T* q, const T* k, const T* v, T* o, T* saved_summaries,
               T* saved_mixed) const override {
    return kernel_.forward(q, k, v, o, saved_summaries, saved_mixed);
  }
  bool backward(const T* q, const T* k, const T* v, const T* grad_o, T* grad_q, T* grad_k,
                T* grad_v, T* grad_w, const T* saved_summaries,
                const T* saved_mixed) const override {
    return kernel_.backward(q, k, v, grad_o, grad_q, grad_k, grad_v, grad_w, saved_summaries,
                            saved_mixed);
  }
  // The phases and their backward, each writing (not adding to) its results
  // unless it says otherwise.
  // 1. [S_b | z_b] = phi(K_b)^T [V_b | 1]
  void summaries(const T* k, const T* v, T* summaries) const {
    kernel_.compute_summaries(k, v, summaries);
  }
  // 2. the mix of the summaries through W's rows of this call's blocks
  void mix(const T* summaries, T* mixed) const { mixer_->mix(summaries, mixed); }
  // Backward of 2: writes grad_summaries, adds to grad_w.
  void mix_backward(const T* grad_mixed, const T* summaries, T* grad_summaries, T* grad_w) const {
    // The causal in-block dW[i, i] is output_gradients'.
    mixer_->mix_backward(grad_mixed, summaries, nullptr, grad_summaries, grad_w);
  }
  // 3. o from the mixed summaries (causal: plus the in-block term)
  bool outputs(const T* q, const T* k, const T* v, const T* mixed, T* o) const {
    return kernel_.compute_outputs(q, k, v, mixed, o);
  }
  // Backward of 3: writes grad_mixed and grad_q; causal, also the in-block
  // parts of grad_k and grad_v (written) and of grad_w's diagonal (added).
  bool output_gradients(const T* q, const T* k, const T* v, const T* grad_o, const T* mixed,
                        T* grad_mixed, T* grad_q, T* grad_k, T* grad_v, T* grad_w) const {
    T* diagonal = p_.causal ? scratch<T>(KernelScratch::diagonal_grad,
                                         size_t(p_.batch * p_.heads * p_.blocks))
                            : nullptr;
    const bool finite = kernel_.output_gradients(q, k, v, grad_o, mixed, grad_mixed, diagonal,
                                                 grad_q, grad_k, grad_v, false);
    if (p_.causal) add_diagonal(diagonal, grad_w);
    return finite;
  }
  // Backward of 1: writes grad_k and grad_v.
  void key_value_gradients(const T* k, const T* v, const T* grad_summaries, T* grad_k,
                           T* grad_v) const {
    kernel_.key_value_gradients(k, v, grad_summaries, grad_k, grad_v, false);
  }

 private:
  // dW[i, i] of the causal in-block term, [B*H, M], added to W's diagonal at
  // this call's rows, summed over the batch (and the heads when w is shared)
  // in a fixed order.
  void add_diagonal(const T* diagonal, T* grad_w) const {
    const int64_t heads = p_.heads, m = p_.blocks;
    for (int64_t bh = 0; bh < p_.batch * heads; ++bh) {
      const int64_t copy = p_.per_head_mixing ? bh % heads : 0;
      for (int64_t i = 0; i < m; ++i) {
        const int64_t row = p_.first_block + i;
        T& entry = p_.toeplitz ? grad_w[copy * (p_.toeplitz_length + 1)]
                               : grad_w[(copy * p_.w_stride + row) * p_.w_stride + row];
        entry += diagonal[bh * m + i];
      }
    }
  }

  const detail::Problem p_;
  const std::unique_ptr<Mixer<T>> mixer_;
  const ChunkedAttention<T> kernel_;
};

}  // namespace mhla::cpu
