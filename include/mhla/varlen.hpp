#pragma once
// Packed variable-length batches (the cu_seqlens convention of FlashAttention
// and flash-linear-attention): S sequences of different lengths laid end to end
// in one [1, total, H, D] tensor, sequence s holding tokens
// cu_seqlens[s] .. cu_seqlens[s + 1] - 1.
//
// Each sequence is its own 1D MHLA problem: its blocks of `block` tokens start
// at its first token (its last block may be short), so no block straddles two
// sequences and no token reads another sequence. Dense w is [M, M] or
// [H, M, M] and sequence s uses its top-left M_s x M_s corner (M_s = its block
// count), so M must cover the longest sequence; Toeplitz w serves any length.
#include <cstdint>

#include "mhla/options.hpp"
#include "mhla/tensor.hpp"

namespace mhla {

struct VarlenOptions : LinearAttentionOptions {
  int64_t block = 64;  // tokens per block, in every sequence
  MixingForm mixing = MixingForm::dense;
};

// cu_seqlens [S + 1]: 0 = cu[0] <= cu[1] <= ... <= cu[S] = total (empty
// sequences are allowed and produce nothing). q, k [1, total, H, Dk];
// v, o [1, total, H, Dv].
template <typename T>
void varlen_forward(const VarlenOptions& options, TensorView<const int64_t> cu_seqlens,
                    TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                    TensorView<const T> w, TensorView<T> o);

// Gradients of sum(grad_o * o); grad_w (w's shape) sums every sequence's
// contribution, a dense w's entries beyond all corners getting zero.
template <typename T>
void varlen_backward(const VarlenOptions& options, TensorView<const int64_t> cu_seqlens,
                     TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                     TensorView<const T> w, TensorView<const T> o, TensorView<const T> grad_o,
                     TensorView<T> grad_q, TensorView<T> grad_k, TensorView<T> grad_v,
                     TensorView<T> grad_w);

}  // namespace mhla
