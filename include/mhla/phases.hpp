#pragma once
// MHLA's three phases as separate calls, with the block summaries between them
// as ordinary tensors:
//   1. block_summaries: [S_b | z_b] = phi(K_b)^T [V_b | 1] for each block b;
//   2. mix_summaries:   mixed_i = sum_b W[i, b] [S_b | z_b] over the blocks b
//                       that block i reads (none: all; block_causal: b <= i;
//                       causal: b < i, W[i, i] acting token by token in 3);
//   3. read_out:        o_t = phi(q_t)^T S~_i / (phi(q_t)^T z~_i + eps), or
//                       scale * phi(q_t)^T S~_i (causal: plus the in-block term).
// mhla::forward is these three in one call. The phases serve code that runs
// them apart: a long causal sequence processed in pieces (forward_piece below),
// a context-parallel layer that exchanges block summaries between ranks, a
// layer that caches or inspects the summaries.
//
// Summary tensors: [B, H, M, Dk, Dv + 1], S_b in the first Dv columns and z_b
// in the last (mhla::saved_summaries_shape).
//
// A call's blocks need not be the whole sequence. first_block is the index in
// W of the call's first block. mix_summaries reads the summaries of all Ms
// blocks that W covers (dense w [M', M'] or [H, M', M'] with M' = Ms; Toeplitz
// w any) and writes the M rows first_block .. first_block + M - 1, M being
// mixed's block count. read_out reads W's diagonal at the same rows. An
// ordinary call has first_block = 0 and Ms = M.
//
// Arguments are validated as by mhla::forward (messages name the function and
// the argument). The backward functions ADD their gradients to the buffers
// they are given, so that the contributions of the phases to grad_k, grad_v
// and grad_w sum up: zero the buffers first. Supported T: float, double.
#include <cstdint>

#include "mhla/options.hpp"
#include "mhla/tensor.hpp"

namespace mhla {

// Phase 1. k [B, N, H, Dk], v [B, N, H, Dv] with N = options.layout's tokens;
// summaries [B, H, M, Dk, Dv + 1] with M = options.layout's blocks.
template <typename T>
void block_summaries(const Options& options, TensorView<const T> k, TensorView<const T> v,
                     TensorView<T> summaries);

// Phase 2. summaries [B, H, Ms, Dk, Dv + 1] -> mixed [B, H, M, Dk, Dv + 1]
// (rows first_block .. first_block + M - 1 of W). options.layout is not read.
template <typename T>
void mix_summaries(const Options& options, TensorView<const T> w, TensorView<const T> summaries,
                   TensorView<T> mixed, int64_t first_block = 0);

// Phase 3. q, k [B, N, H, Dk], v [B, N, H, Dv], mixed [B, H, M, Dk, Dv + 1] ->
// o [B, N, H, Dv]. Causal mode reads k, v and W's diagonal for the in-block
// term; the other modes read only q and mixed (k, v and w are still checked).
template <typename T>
void read_out(const Options& options, TensorView<const T> q, TensorView<const T> k,
              TensorView<const T> v, TensorView<const T> w, TensorView<const T> mixed,
              TensorView<T> o, int64_t first_block = 0);

// Backward of phase 1: adds the gradients of sum(grad_summaries * summaries).
template <typename T>
void block_summaries_backward(const Options& options, TensorView<const T> k, TensorView<const T> v,
                              TensorView<const T> grad_summaries, TensorView<T> grad_k,
                              TensorView<T> grad_v);

// Backward of phase 2: adds dS_b = sum_i W[i, b] dmixed_i to grad_summaries
// [B, H, Ms, Dk, Dv + 1] and dW[i, b] = sum <dmixed_i, S_b> (over the batch,
// and the heads when w is shared) to grad_w (w's shape).
template <typename T>
void mix_summaries_backward(const Options& options, TensorView<const T> w,
                            TensorView<const T> summaries, TensorView<const T> grad_mixed,
                            TensorView<T> grad_summaries, TensorView<T> grad_w,
                            int64_t first_block = 0);

// Backward of phase 3: adds to grad_q, grad_mixed, and in causal mode to
// grad_k, grad_v (the in-block term) and W's diagonal in grad_w. o must be
// read_out's result on the same inputs.
template <typename T>
void read_out_backward(const Options& options, TensorView<const T> q, TensorView<const T> k,
                       TensorView<const T> v, TensorView<const T> w, TensorView<const T> mixed,
                       TensorView<const T> o, TensorView<const T> grad_o, TensorView<T> grad_q,
                       TensorView<T> grad_k, TensorView<T> grad_v, TensorView<T> grad_mixed,
                       TensorView<T> grad_w, int64_t first_block = 0);

// One piece of a long causal or block-causal sequence: the P blocks before it
// are summarised in state_in [B, H, P, Dk, Dv + 1] (P = 0: an empty state,
// shape [B, H, 0, Dk, Dv + 1] and any data pointer); options.layout describes
// the piece's own M blocks, and w covers P + M blocks (dense [.., P + M, P + M];
// Toeplitz w serves any length). Writes the piece's outputs o and the state
// after it, state_out [B, H, P + M, Dk, Dv + 1] (state_in followed by the
// piece's summaries). Feeding a sequence's pieces in order, each with the
// previous piece's state_out, gives the outputs of one forward call on the
// whole sequence. The piece must end at a block boundary unless it is the last.
template <typename T>
void forward_piece(const Options& options, TensorView<const T> q, TensorView<const T> k,
                   TensorView<const T> v, TensorView<const T> w, TensorView<const T> state_in,
                   TensorView<T> o, TensorView<T> state_out);

}  // namespace mhla
