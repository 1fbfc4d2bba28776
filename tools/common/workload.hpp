#pragma once
// A synthetic attention workload (random q, k, v, upstream gradient and a
// locality-initialised mixing matrix) shared by the demo and the benchmarks,
// with one call per method so every comparison runs the same data.
#include <cstdint>
#include <vector>

#include "mhla/line_aligned.hpp"
#include "mhla/mhla.hpp"

namespace mhla::tools {

struct Workload {
  int64_t batch, tokens, heads, dim;
  Options options;  // 1D, elu1 features, normalized
  // The [B, N, H, D] tensors and the saved summaries start on cache lines, as
  // torch places its tensors (a 16-byte offset, std::vector's, made every head
  // row span one line more and the forward at N = 16384, H = 8 4% slower).
  using Tensor = detail::LineAlignedVector<float>;
  Tensor q, k, v, grad_o;
  std::vector<float> w;
  // Outputs and gradients, allocated once.
  Tensor o, lse, grad_q, grad_k, grad_v;
  std::vector<float> grad_w;
  ForwardState<float> state, bf16_state;  // filled by mhla_forward_saving(), bf16_forward_saving()
  using Bf16Tensor = detail::LineAlignedVector<bfloat16>;
  Bf16Tensor bq, bk, bv, bgrad_o, bo, bgrad_q, bgrad_k, bgrad_v;  // bf16_*()

  // blocks: number of MHLA blocks M (block size ceil(N / M)).
  Workload(int64_t batch, int64_t tokens, int64_t heads, int64_t dim, int64_t blocks,
           Masking masking = Masking::none, uint64_t seed = 1);

  std::vector<int64_t> shape() const { return {batch, tokens, heads, dim}; }
  std::vector<int64_t> w_shape() const;
  // Bytes of inputs, outputs and gradients of one forward+backward call.
  double tensor_bytes() const;

  void mhla_forward();
  void mhla_backward();  // recomputes the block summaries
  // The training path: forward keeps the block and mixed summaries in its
  // ForwardState, backward reuses them.
  void mhla_forward_saving();
  void mhla_backward_saved();
  // The same calls on bfloat16 copies of q, k, v and grad_o (made on first
  // use) with bfloat16 outputs and gradients; bf16_backward_saved() reads
  // what bf16_forward_saving() kept.
  void bf16_forward();
  void bf16_forward_saving();
  void bf16_backward_saved();
  void linear_forward();
  void linear_backward();
  void softmax_forward();
  void softmax_backward();
};

// M = round(sqrt(N)): the paper's recommended M^2 <= N at its upper end.
int64_t blocks_for(int64_t tokens);

}  // namespace mhla::tools
