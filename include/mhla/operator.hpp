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
// argument, the expected and the given value.
//
// Finite inputs never give silent NaN or infinity: if a result is not finite
// although q, k, v (and w, o, grad_o) are, the call throws mhla::Error naming
// the entry and the cause (a zero denominator with eps = 0 or the identity
// feature map, or phi(q)^T S~ overflowing T). Non-finite inputs propagate as in
// IEEE arithmetic.
#include <string>
#include <type_traits>
#include <vector>

#include "mhla/bfloat16.hpp"
#include "mhla/float16.hpp"
#include "mhla/forward_state.hpp"
#include "mhla/options.hpp"
#include "mhla/tensor.hpp"

namespace mhla {

// The element type of w, grad_w and a ForwardState for tokens (q, k, v, o and
// their gradients) of element type T: T for float and double, float for
// bfloat16 and float16.
template <typename T>
using weight_t =
    std::conditional_t<std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>, float, T>;

// Tokens of element type T: float, double, bfloat16 or float16 (the 16-bit
// ones with float32 w, grad_w and state).
//
// bfloat16: forward runs the block products on bfloat16 operands with float32
// sums where the CPU has AVX512-BF16: phi(q) and phi(k) are rounded to
// bfloat16 as the products read them, the summaries and normalisers are
// float32, the dense mix rounds the summaries and w to bfloat16 (also when a
// state keeps its result: backward reads it, never o, so o and the gradients
// see the same mix), and o is rounded once. Backward there reads the bfloat16
// tensors in place, runs every product (dphi(q), dS~, dS, dw, dphi(k), dv) on
// bfloat16 operands and rounds each gradient once. On other CPUs, and in
// causal mode, both compute in float32 on widened copies in the calling
// thread's scratch (release_scratch frees them). On CUDA both run on tensor
// cores, causal mode included, every operand split into two bfloat16 halves
// so that the sums stay near float32 (docs/cuda.md); shapes past the kernels'
// grid limits compute in float32 on widened copies. See docs/operator.md,
// "bfloat16".
//
// float16: both compute in float32 on widened copies (exact) and round each
// result once; on CUDA, where the call's options.cuda.float16_tensor_cores is
// set, they run on the bfloat16 operator's tensor-core kernels instead, which
// split every operand into two bfloat16 halves (a float16 value is their exact
// sum). A result that is finite in float32 but beyond float16's range (65504)
// is an mhla::Error naming the entry, not an infinity. See docs/operator.md,
// "float16".
template <typename T>
void forward(const Options& options, TensorView<const T> q, TensorView<const T> k,
             TensorView<const T> v, TensorView<const weight_t<T>> w, TensorView<T> o);

// Gradients of sum(grad_o * o) with respect to q, k, v and w, recomputing
// what forward computed. `o` must come from forward() on the same inputs (its
// shape is checked; the CPU kernels form grad_o . o from their products
// instead of reading it, docs/operator.md). grad_w is summed over the batch,
// and over heads when w is shared; it has w's shape.
template <typename T>
void backward(const Options& options, TensorView<const T> q, TensorView<const T> k,
              TensorView<const T> v, TensorView<const weight_t<T>> w, TensorView<const T> o,
              TensorView<const T> grad_o, TensorView<T> grad_q, TensorView<T> grad_k,
              TensorView<T> grad_v, TensorView<weight_t<T>> grad_w);

// The same calls with a ForwardState (mhla/forward_state.hpp): forward also
// keeps each block's key/value summary [S_b | z_b] and the mixed summaries
// [S~_i | z~_i] each query block reads, and backward reads them instead of
// running any pass of forward again (as attention kernels save their softmax
// statistics for the backward pass), at the price of two O(B H M Dk Dv)
// arrays between the passes. backward checks that the state was filled by a
// forward on these options, tensors and w's values. On a device, forward
// keeps a host copy of w and backward compares one with it.
template <typename T>
void forward(const Options& options, TensorView<const T> q, TensorView<const T> k,
             TensorView<const T> v, TensorView<const weight_t<T>> w, TensorView<T> o,
             ForwardState<weight_t<T>>& state);
template <typename T>
void backward(const Options& options, TensorView<const T> q, TensorView<const T> k,
              TensorView<const T> v, TensorView<const weight_t<T>> w, TensorView<const T> o,
              TensorView<const T> grad_o, TensorView<T> grad_q, TensorView<T> grad_k,
              TensorView<T> grad_v, TensorView<weight_t<T>> grad_w,
              const ForwardState<weight_t<T>>& state);

// [B, H, M, Dk, Dv + 1] for q [B, N, H, Dk] and v [B, N, H, Dv]: the shape of
// a ForwardState's arrays. Per block, S_b = sum phi(k) v^T in the first Dv
// columns and z_b = sum phi(k) in the last; the mixed summaries likewise.
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
