#pragma once
// The blocked (chunkwise) linear-attention kernel behind MHLA and the
// linear-attention baseline. Per (batch, head) slice:
//   1. summaries: [S_b | z_b] = phi(K_b)^T [V_b | 1]        one GEMM per block
//   2. mix:       [S~_i | z~_i] from the summaries          Mixer (one GEMM per slice)
//   3. outputs:   y_t = phi(q_t)^T [S~_i | z~_i]            one GEMM per block
//                 (+ causal in-block term W[i,i] (phi(Q) phi(K)^T masked) [V | 1])
//                 o_t = y_t[:Dv] / (y_t[Dv] + eps)  or  scale * y_t[:Dv]
// Appending a column of ones to V makes the normaliser z ride along in the same
// GEMMs as S. The backward pass recomputes phases 1-2 (unless forward saved
// their results), then runs the same GEMMs transposed. Nothing of size N x N is ever formed: the
// largest buffers are three [B*H, M, Dk*(Dv+1)] summary arrays and per-thread block tiles.
#include "core/validate.hpp"
#include "cpu/block_rows.hpp"
#include "cpu/block_tasks.hpp"
#include "cpu/mixer.hpp"

namespace mhla::cpu {

template <typename T>
class ChunkedAttention {
 public:
  // problem.table and problem.blocks describe the blocks; mixer supplies W.
  ChunkedAttention(const mhla::detail::Problem& problem, const Mixer<T>& mixer);

  // The whole operator on an ordinary call (the mix reads all of W:
  // first_block 0, mixing_blocks = blocks).
  // summaries_out / saved_summaries and mixed_out / saved_mixed: optional
  // [B*H, M, Dk*(Dv+1)] arrays in which forward keeps the block summaries and
  // the mixed summaries, and from which backward reads them instead of
  // recomputing them (phases 1 and 2).
  // Both return whether every output they wrote is finite (for backward:
  // grad_q, grad_k and grad_v; grad_w is small enough to scan afterwards),
  // observed while the values are hot, so the API layer only searches the
  // results when something went wrong. backward adds to grad_w.
  bool forward(const T* q, const T* k, const T* v, T* o, T* summaries_out = nullptr,
               T* mixed_out = nullptr) const;
  bool backward(const T* q, const T* k, const T* v, const T* grad_o, T* grad_q, T* grad_k,
                T* grad_v, T* grad_w, const T* saved_summaries = nullptr,
                const T* saved_mixed = nullptr) const;

  // The three phases and their backward, each on this call's blocks; the mix
  // between them is the mixer's. Summary arrays are [B*H, M, Dk*(Dv+1)].
  // 1. [S_b | z_b] = phi(K_b)^T [V_b | 1]; also from bfloat16 tokens, widened
  //    as they are gathered (S = bfloat16, T = float: the bfloat16 backward's
  //    recomputed summaries).
  template <typename S = T>
  void compute_summaries(const S* k, const S* v, T* summaries) const;
  // 3. o from the mixed summaries (causal: plus the in-block term).
  bool compute_outputs(const T* q, const T* k, const T* v, const T* mixed, T* o) const;
  // Backward of 3: writes the gradient of `mixed` into mixed_grad (which may
  // be `mixed` itself: each block is read before it is overwritten) and grad_q;
  // causal, also the in-block parts of grad_k and grad_v, and the in-block
  // dW[i,i] per slice and block into diagonal_grad [B*H, M]. With `park`, the
  // in-block key gradient is left before phi' for key_value_gradients to
  // finish (one pass over grad_k instead of two).
  bool output_gradients(const T* q, const T* k, const T* v, const T* grad_o, const T* mixed,
                        T* mixed_grad, T* diagonal_grad, T* grad_q, T* grad_k, T* grad_v,
                        bool park) const;
  // Backward of 1: writes grad_k and grad_v, or with `add_to_parked` adds the
  // inter-block part to what output_gradients parked there.
  bool key_value_gradients(const T* k, const T* v, const T* summaries_grad, T* grad_k, T* grad_v,
                           bool add_to_parked) const;

 private:
  BlockTask block_task(int64_t task) const { return cpu::block_task(p_, task); }
  int64_t task_count() const { return cpu::task_count(p_); }

  // Causal in-block scores of a task: gathers phi(K_i) into kap and [V_i | 1]
  // into vals, and sets a = mask(u phi(K_i)^T) (keys after the query zeroed;
  // entries right of a row's tile of kTriangleTile rows are left unwritten).
  void in_block_scores(const BlockTask& t, const T* k, const T* v, const T* u, T* kap, T* vals,
                       T* a) const;

  mhla::detail::Problem p_;
  const Mixer<T>& mixer_;
  int64_t x1_;        // Dv + 1 columns of [V | 1]
  int64_t ld_x1_;     // x1_ rounded up to whole cache lines: the row pitch of [rows, Dv + 1] tiles
  int64_t x_;         // Dk * (Dv + 1): one summary
  int64_t max_rows_;  // largest block
};

}  // namespace mhla::cpu
