#pragma once
// The MHLA operator: fast CPU forward and backward.
//
// Shapes (row-major):
//   q, k      [B, N, H, Dk]
//   v, o      [B, N, H, Dv]
//   w         [M, M] shared by all heads, or [H, M, M] per head; M = layout.num_blocks()
// w[i, b] is how much query block i reads from key block b. In causal mode only
// b <= i is read and the upper triangle receives zero gradient.
//
// Both functions validate every argument and throw mhla::Error naming the
// argument, the expected and the given value. Supported T: float, double;
// bfloat16 and float16 tokens have their own overloads below.
//
// Finite inputs never give silent NaN or infinity: if a result is not finite
// although q, k, v (and w, o, grad_o) are, the call throws mhla::Error naming
// the entry and the cause (a zero denominator with eps = 0 or the identity
// feature map, or phi(q)^T S~ overflowing T). Non-finite inputs propagate as in
// IEEE arithmetic.
#include <string>

#include "mhla/bfloat16.hpp"
#include "mhla/float16.hpp"
#include "mhla/forward_state.hpp"
#include "mhla/options.hpp"
#include "mhla/tensor.hpp"

namespace mhla {

//
// saved_summaries (optional, shape saved_summaries_shape()): when given, forward
// also stores each block's key/value summary [S_b | z_b] there, and backward
// reads them instead of recomputing them (as attention kernels save their
// softmax statistics for the backward pass). saved_mixed (optional, the same
// shape) does the same for the mixed summaries [S~_i | z~_i] that each query
// block reads, sparing backward the mix as well: with both saved, backward
// runs no pass of forward again, at the price of keeping two
// O(B H M Dk Dv) arrays between the passes.
template <typename T>
void forward(const Options& options, TensorView<const T> q, TensorView<const T> k,
             TensorView<const T> v, TensorView<const T> w, TensorView<T> o,
             TensorView<T> saved_summaries = {}, TensorView<T> saved_mixed = {});

// Gradients of sum(grad_o * o) with respect to q, k, v and w. `o` (and
// saved_summaries and saved_mixed, if given) must come from forward() on the
// same inputs (its shape is checked; the CPU kernels form grad_o . o from
// their products instead of reading it, docs/operator.md). grad_w is
// summed over the batch, and over heads when w is shared; it has w's shape.
// Saved summaries and saved mixed summaries are fingerprinted in every block
// against k, v and w (each block's key sums z_b and S_b r for a fixed probe r,
// and their mix by w, recomputed in double: core/saved_state_check.hpp), so
// that arrays saved for other k or v, or before w changed (an optimizer step
// between forward and backward), are an mhla::Error rather than wrong
// gradients. The check reads k and v once.
template <typename T>
void backward(const Options& options, TensorView<const T> q, TensorView<const T> k,
              TensorView<const T> v, TensorView<const T> w, TensorView<const T> o,
              TensorView<const T> grad_o, TensorView<T> grad_q, TensorView<T> grad_k,
              TensorView<T> grad_v, TensorView<T> grad_w, TensorView<const T> saved_summaries = {},
              TensorView<const T> saved_mixed = {});

// bfloat16 q, k, v and o (and gradients), with w, grad_w and the saved arrays
// in float32. Forward runs the block products on bfloat16 operands with
// float32 sums where the CPU has AVX512-BF16: phi(q) and phi(k) are rounded
// to bfloat16 as the products read them, the summaries and normalisers are
// float32, the dense mix rounds the summaries and w to bfloat16 (also when
// saved_mixed keeps its result: backward reads it, never o, so o and the
// gradients see the same mix), and o is rounded once. Backward there reads
// the bfloat16 tensors in place, runs every product (dphi(q), dS~, dS, dw,
// dphi(k), dv) on bfloat16 operands and rounds each gradient once. On other
// CPUs, and in causal mode, both compute in float32 on widened copies in the
// calling thread's scratch (release_scratch frees them). On CUDA both run on
// tensor cores, causal mode included, every operand split into two bfloat16
// halves so that the sums stay near float32 (docs/cuda.md); shapes past the
// kernels' grid limits compute in float32 on widened copies.
// The fingerprints of the saved arrays allow for the bfloat16 roundings of
// phi(k), and of w and the summaries in the mix. See docs/operator.md, "bfloat16".
void forward(const Options& options, TensorView<const bfloat16> q, TensorView<const bfloat16> k,
             TensorView<const bfloat16> v, TensorView<const float> w, TensorView<bfloat16> o,
             TensorView<float> saved_summaries = {}, TensorView<float> saved_mixed = {});
void backward(const Options& options, TensorView<const bfloat16> q, TensorView<const bfloat16> k,
              TensorView<const bfloat16> v, TensorView<const float> w, TensorView<const bfloat16> o,
              TensorView<const bfloat16> grad_o, TensorView<bfloat16> grad_q,
              TensorView<bfloat16> grad_k, TensorView<bfloat16> grad_v, TensorView<float> grad_w,
              TensorView<const float> saved_summaries = {},
              TensorView<const float> saved_mixed = {});

// float16 q, k, v and o (and gradients), with w, grad_w and the saved arrays
// in float32, as for bfloat16. Both compute in float32 on widened copies
// (exact) and round each result once; on CUDA, where the call's
// options.cuda.float16_tensor_cores is set, they run on the bfloat16 operator's
// tensor-core kernels instead, which split every operand into two bfloat16
// halves (a float16 value is their exact sum). A result that is
// finite in float32 but beyond float16's range (65504) is an mhla::Error
// naming the entry, not an infinity. See docs/operator.md, "float16".
void forward(const Options& options, TensorView<const float16> q, TensorView<const float16> k,
             TensorView<const float16> v, TensorView<const float> w, TensorView<float16> o,
             TensorView<float> saved_summaries = {}, TensorView<float> saved_mixed = {});
void backward(const Options& options, TensorView<const float16> q, TensorView<const float16> k,
              TensorView<const float16> v, TensorView<const float> w, TensorView<const float16> o,
              TensorView<const float16> grad_o, TensorView<float16> grad_q,
              TensorView<float16> grad_k, TensorView<float16> grad_v, TensorView<float> grad_w,
              TensorView<const float> saved_summaries = {},
              TensorView<const float> saved_mixed = {});

// The same calls with a ForwardState (mhla/forward_state.hpp) in place of the
// saved arrays: forward fills it, backward reads it after checking that it
// was filled by a forward on these options, tensors and w's values. The
// results are those of passing saved_summaries and saved_mixed; what the
// state spares is their fingerprint check (a read of k and v, about a quarter
// of a backward's time on the CPU) and the caller's allocation. On a device,
// forward keeps a host copy of w and backward compares one with it.
template <typename T>
void forward(const Options& options, TensorView<const T> q, TensorView<const T> k,
             TensorView<const T> v, TensorView<const T> w, TensorView<T> o,
             ForwardState<T>& state);
template <typename T>
void backward(const Options& options, TensorView<const T> q, TensorView<const T> k,
              TensorView<const T> v, TensorView<const T> w, TensorView<const T> o,
              TensorView<const T> grad_o, TensorView<T> grad_q, TensorView<T> grad_k,
              TensorView<T> grad_v, TensorView<T> grad_w, const ForwardState<T>& state);
void forward(const Options& options, TensorView<const bfloat16> q, TensorView<const bfloat16> k,
             TensorView<const bfloat16> v, TensorView<const float> w, TensorView<bfloat16> o,
             ForwardState<float>& state);
void backward(const Options& options, TensorView<const bfloat16> q, TensorView<const bfloat16> k,
              TensorView<const bfloat16> v, TensorView<const float> w, TensorView<const bfloat16> o,
              TensorView<const bfloat16> grad_o, TensorView<bfloat16> grad_q,
              TensorView<bfloat16> grad_k, TensorView<bfloat16> grad_v, TensorView<float> grad_w,
              const ForwardState<float>& state);
void forward(const Options& options, TensorView<const float16> q, TensorView<const float16> k,
             TensorView<const float16> v, TensorView<const float> w, TensorView<float16> o,
             ForwardState<float>& state);
void backward(const Options& options, TensorView<const float16> q, TensorView<const float16> k,
              TensorView<const float16> v, TensorView<const float> w, TensorView<const float16> o,
              TensorView<const float16> grad_o, TensorView<float16> grad_q,
              TensorView<float16> grad_k, TensorView<float16> grad_v, TensorView<float> grad_w,
              const ForwardState<float>& state);

// [B, H, M, Dk, Dv + 1] for q [B, N, H, Dk] and v [B, N, H, Dv]: per block,
// S_b = sum phi(k) v^T in the first Dv columns and z_b = sum phi(k) in the last.
// The shape of saved_mixed too.
std::vector<int64_t> saved_summaries_shape(const Options& options,
                                           const std::vector<int64_t>& q_shape,
                                           const std::vector<int64_t>& v_shape);

// The operator keeps its O(B H M Dk Dv) scratch arrays on the calling thread
// between calls (reallocating them every call cost a third of a forward pass).
// This frees the calling thread's scratch.
void release_scratch();

// Whether the bfloat16 operator runs its block products on bfloat16 operands
// here (the CPU has AVX512-BF16 and the kernels run on AVX-512); otherwise it
// computes in float32 on widened copies.
bool bf16_products();

// The instruction set the float kernels run on: the best of those compiled in
// (SSE4, AVX2, AVX3 = AVX-512, ...) that this CPU supports, chosen at run time.
std::string kernel_isa();

// Floating-point operations the algorithm needs (multiply-add = 2), used by the
// benchmarks to report rates. Backward excludes the recomputation of the block
// summaries (the usual convention for attention kernels).
struct FlopCount {
  double forward = 0;
  double backward = 0;
};
FlopCount mhla_flops(int64_t batch, int64_t tokens, int64_t heads, int64_t dk, int64_t dv,
                     int64_t blocks, Masking masking, int64_t block_size);

}  // namespace mhla
