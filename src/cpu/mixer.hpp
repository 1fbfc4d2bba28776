#pragma once
// The mixing step between block summaries and block outputs. Summaries are
// stored as [B*H, Ms, X] with X = Dk * (Dv + 1): each block's Dk x (Dv + 1)
// matrix [S_b | z_b] (the key sums ride along as an extra value column), and
// the mix writes [B*H, M, X], one row per block of the call. Ms is the
// problem's mixing_blocks and row i is W's row first_block + i (an ordinary
// call: Ms = M, first_block = 0).
//
// Forward:  mixed_i = sum_b W[i,b] S_b   (causal: b < i, W[i,i] being applied
//           inside the block, token by token, by the kernel; block-causal: b <= i).
// Backward: dS_b = sum_i W[i,b] dmixed_i (written) and dW[i,b] = <dmixed_i, S_b>
//           (added to grad_w, so that several calls can share one gradient).
//
// All loops split the work into a fixed set of panels whatever the thread
// count, so results are bit-identical across thread counts.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/validate.hpp"

namespace mhla::cpu {

template <typename T>
class Mixer {
 public:
  virtual ~Mixer() = default;
  virtual void mix(const T* summaries, T* mixed) const = 0;
  // mix() for the bfloat16 forward (cpu/bf16_forward.hpp): the dense mix runs
  // its products on the summaries and W rounded to bfloat16 (float sums);
  // the other mixers, whose work is O(M X) adds, mix as mix() does.
  virtual void mix_bf16(const T* summaries, T* mixed) const { mix(summaries, mixed); }
  // Whether mix_summary_pairs() may run: the dense mix on bfloat16 products
  // can read the summaries as the bfloat16 forward writes them when it keeps
  // none, pairs of blocks already rounded ([B*H, (Ms + 1) / 2, X] words,
  // block 2p in the low halves, 2p + 1 in the high; an odd Ms' last high
  // halves zero), sparing the float array and its packing.
  virtual bool takes_summary_pairs() const { return false; }
  virtual void mix_summary_pairs(const uint32_t* /*summary_pairs*/, T* /*mixed*/) const {}
  // mix_backward() for the bfloat16 backward: the dense mixer's dS and dW
  // products on bfloat16 operands; the others as mix_backward().
  virtual void mix_backward_bf16(const T* mixed_grad, const T* summaries, const T* diagonal_grad,
                                 T* summaries_grad, T* grad_w) const {
    mix_backward(mixed_grad, summaries, diagonal_grad, summaries_grad, grad_w);
  }
  // W[i,i] of the head behind slice bh (the causal in-block weight).
  virtual T diagonal(int64_t bh, int64_t i) const = 0;
  // mixed_grad: [B*H, M, X]; diagonal_grad: [B*H, M] causal in-block dW[i,i]
  // terms (nullptr when not causal); grad_w: w's shape, added to, or nullptr
  // when the mixer has no parameters.
  virtual void mix_backward(const T* mixed_grad, const T* summaries, const T* diagonal_grad,
                            T* summaries_grad, T* grad_w) const = 0;
};

// A learnt dense W, shared [M, M] or per head [H, M, M] (rows w_stride apart).
template <typename T>
class DenseMixer final : public Mixer<T> {
 public:
  DenseMixer(const mhla::detail::Problem& problem, const T* w);
  void mix(const T* summaries, T* mixed) const override;
  void mix_bf16(const T* summaries, T* mixed) const override;
  bool takes_summary_pairs() const override;
  void mix_summary_pairs(const uint32_t* summary_pairs, T* mixed) const override;
  T diagonal(int64_t bh, int64_t i) const override;
  void mix_backward(const T* mixed_grad, const T* summaries, const T* diagonal_grad,
                    T* summaries_grad, T* grad_w) const override;
  void mix_backward_bf16(const T* mixed_grad, const T* summaries, const T* diagonal_grad,
                         T* summaries_grad, T* grad_w) const override;

 private:
  void backward(const T* mixed_grad, const T* summaries, const T* diagonal_grad, T* summaries_grad,
                T* grad_w, bool bf16_products) const;
  // The bfloat16 mix from float summaries or from summary pairs (one of them).
  void mix_pairs(const T* summaries, const uint32_t* summary_pairs, T* mixed) const;
  // The call's rows of W (row i = W's row first_block + i) for the head behind
  // slice bh, and their leading dimension.
  const T* head_rows(int64_t bh) const;
  int64_t rows_ld() const { return masked_.empty() ? p_.w_stride : p_.mixing_blocks; }
  // Masked modes: row i reads the blocks b < first_block + i (causal: W[i,i]
  // acts inside the block, token by token) or b <= first_block + i
  // (block-causal). How many of the mixing blocks row i reads, and the first
  // row that reads block b.
  int64_t blocks_read_by(int64_t i) const {
    return std::min(p_.mixing_blocks, p_.first_block + i + (p_.block_causal ? 1 : 0));
  }
  int64_t first_row_reading(int64_t b) const {
    return std::max<int64_t>(0, b + 1 - p_.first_block - (p_.block_causal ? 1 : 0));
  }

  mhla::detail::Problem p_;
  const T* w_;
  int64_t x_;  // Dk * (Dv + 1)
  std::vector<T>
      masked_;  // masked modes: the call's rows [copies, M, Ms] with unread entries zeroed
};

// Toeplitz W[i, b] = w[min(i - b, L)] (b <= i), shared [L + 1] or per head
// [H, L + 1]. Distances below L are applied one by one and every distance >= L
// through a running prefix sum of the summaries, so the mix costs
// O(M min(M, L) X) instead of the dense O(M^2 X).
template <typename T>
class ToeplitzMixer final : public Mixer<T> {
 public:
  ToeplitzMixer(const mhla::detail::Problem& problem, const T* w);
  void mix(const T* summaries, T* mixed) const override;
  T diagonal(int64_t bh, int64_t) const override { return head_w(bh)[0]; }
  void mix_backward(const T* mixed_grad, const T* summaries, const T* diagonal_grad,
                    T* summaries_grad, T* grad_w) const override;

 private:
  const T* head_w(int64_t bh) const;

  mhla::detail::Problem p_;
  const T* w_;
  int64_t length_;      // L: the tail w[L] covers distances >= L
  int64_t nearest_;     // smallest distance the mix applies: 1 causal (W[i,i] acts in-block), 0
                        // block-causal
  int64_t tail_start_;  // smallest distance covered by the running sum: max(L, nearest_)
  int64_t x_;
};

// The mixer a validated MHLA problem asks for (dense or Toeplitz w).
template <typename T>
std::unique_ptr<Mixer<T>> make_mixer(const mhla::detail::Problem& problem, const T* w);

// W = all ones with no parameters: vanilla linear attention, whose mix is a
// plain sum (non-causal) or an exclusive prefix sum (causal) in O(M X).
template <typename T>
class UniformMixer final : public Mixer<T> {
 public:
  explicit UniformMixer(const mhla::detail::Problem& problem);
  void mix(const T* summaries, T* mixed) const override;
  T diagonal(int64_t, int64_t) const override { return T(1); }
  void mix_backward(const T* mixed_grad, const T* summaries, const T* diagonal_grad,
                    T* summaries_grad, T* grad_w) const override;

 private:
  mhla::detail::Problem p_;
  int64_t x_;
};

}  // namespace mhla::cpu
