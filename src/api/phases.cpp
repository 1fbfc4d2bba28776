// The public phase functions: validate once (CPU tensors only), then run one
// phase on the CPU's kernels. The backward phases compute into scratch and
// add, since the kernels' phases write their results (that is what the fused
// backward wants).
#include "mhla/phases.hpp"

#include <algorithm>
#include <vector>

#include "backend/backend.hpp"
#include "core/finite_results.hpp"
#include "core/validate.hpp"
#include "core/validated_call.hpp"
#include "cpu/cpu_attention.hpp"

namespace mhla {
namespace {

using backend::Scratch;
using detail::AttentionDims;
using detail::fail;
using detail::Problem;
using detail::ValidatedCall;

constexpr const char* kSummaryHint = "[B, H, M, Dk, Dv + 1]";

std::vector<int64_t> summary_shape(const AttentionDims& d, int64_t blocks) {
  return {d.batch, d.heads, blocks, d.dk, d.dv + 1};
}

// A summary tensor's sizes: batch, heads, Dk and Dv in dims, its M returned.
int64_t check_summaries(const char* fn, const char* name, const void* data,
                        const std::vector<int64_t>& shape, AttentionDims& dims) {
  detail::check_tensor(fn, name, data, shape, 5, kSummaryHint);
  if (shape[4] < 2)
    fail(fn, std::string(name) + " has shape " + shape_to_string(shape) +
                 "; its last extent is Dv + 1 >= 2 " + kSummaryHint);
  dims.batch = shape[0];
  dims.heads = shape[1];
  dims.dk = shape[3];
  dims.dv = shape[4] - 1;
  return shape[2];
}

// k [B, N, H, Dk] and v [B, N, H, Dv] without q.
template <typename T>
AttentionDims check_kv(const char* fn, const TensorView<const T>& k, const TensorView<const T>& v) {
  detail::check_device(fn, "k", k.device);
  detail::check_device(fn, "v", v.device);
  return detail::check_qkv(fn, k.data, k.shape, k.data, k.shape, v.data, v.shape);
}

// The mixing of a call whose M blocks are W's rows first_block .. first_block +
// M - 1 (problem.blocks = M). Dense w gives Ms; `sources` (the summaries' M,
// or -1 where the call has none) must agree with it.
template <typename T>
void check_call_mixing(const char* fn, const Options& options, const TensorView<const T>& w,
                       int64_t first_block, int64_t sources, Problem& p) {
  const int64_t m = p.blocks;
  detail::check_device(fn, "w", w.device);
  if (first_block < 0) fail(fn, "first_block must be >= 0, got " + std::to_string(first_block));
  if (options.mixing == MixingForm::toeplitz) {
    detail::check_toeplitz_shape(fn, options.masking, w.shape, w.data, p);
    p.mixing_blocks = sources >= 0 ? sources : first_block + m;
  } else {
    Problem square = p;
    detail::check_square_mixing_shape(fn, w.shape, w.data, square);
    p.per_head_mixing = square.per_head_mixing;
    p.mixing_blocks = p.w_stride = square.blocks;
    if (sources >= 0 && sources != p.mixing_blocks)
      fail(fn, "summaries hold " + std::to_string(sources) + " blocks but w has shape " +
                   shape_to_string(w.shape) + " (" + std::to_string(p.mixing_blocks) +
                   " blocks); the mix reads one summary per column of W");
  }
  if (first_block + m > p.mixing_blocks)
    fail(fn, "blocks " + std::to_string(first_block) + " .. " +
                 std::to_string(first_block + m - 1) + " (first_block " +
                 std::to_string(first_block) + ", M = " + std::to_string(m) + ") exceed the " +
                 std::to_string(p.mixing_blocks) + " blocks that " +
                 (sources >= 0 ? "the summaries hold" : "w covers"));
  p.first_block = first_block;
  detail::check_mixing_values(fn, p, w.data);
}

// The checks of a call on q, k, v over options.layout: dims, options, layout
// (causal: 1D). The mixing is checked separately.
Problem check_tokens(const char* fn, const Options& options, const AttentionDims& dims) {
  Problem p = detail::check_linear_options(fn, options, dims);
  detail::check_layout_tokens(fn, options.layout, dims.tokens);
  if (p.causal && options.layout.rank() != 1)
    fail(fn, "causal masking needs a 1D layout, got " + options.layout.describe());
  p.layout = &options.layout;
  p.blocks = p.mixing_blocks = p.w_stride = options.layout.num_blocks();
  return p;
}

// The layout-only problem of phase 1 (no mixing).
template <typename T>
Problem summaries_problem(const char* fn, const Options& options, const TensorView<const T>& k,
                          const TensorView<const T>& v) {
  return check_tokens(fn, options, check_kv(fn, k, v));
}

// The problem of phase 2: sizes from the summaries, M from mixed.
template <typename T>
Problem mix_problem(const char* fn, const Options& options, const TensorView<const T>& w,
                    const TensorView<const T>& summaries, const std::vector<int64_t>& mixed_shape,
                    const void* mixed, int64_t first_block) {
  AttentionDims dims;
  detail::check_device(fn, "summaries", summaries.device);
  const int64_t sources = check_summaries(fn, "summaries", summaries.data, summaries.shape, dims);
  AttentionDims mixed_dims;
  const int64_t rows = check_summaries(fn, "mixed", mixed, mixed_shape, mixed_dims);
  detail::check_shape_equals(fn, "mixed", mixed_shape, summary_shape(dims, rows),
                             "(mixed must share B, H, Dk, Dv + 1 with summaries)");
  Problem p = detail::check_linear_options(fn, options, dims);
  p.blocks = rows;
  check_call_mixing(fn, options, w, first_block, sources, p);
  return p;
}

// The problem of phase 3: q, k, v and the mixing read at the call's rows.
template <typename T>
Problem read_out_problem(const char* fn, const Options& options, const TensorView<const T>& q,
                         const TensorView<const T>& k, const TensorView<const T>& v,
                         const TensorView<const T>& w, const TensorView<const T>& mixed,
                         int64_t first_block) {
  Problem p = check_tokens(fn, options, detail::check_qkv(fn, q, k, v));
  check_call_mixing(fn, options, w, first_block, -1, p);
  detail::check_output(fn, "mixed", mixed, summary_shape(p, p.blocks));
  return p;
}

// Gradients (and a piece's summaries) go through the calling thread's scratch: a fresh
// array per call cost its zeroing and first-touch page faults every time.
// The phases run on the CPU (their checks refuse other devices' memory), on
// the CPU's kernels and scratch.
const backend::Memory& cpu_memory() { return backend::cpu_backend().memory(); }

template <typename T>
T* gradient_scratch(Scratch slot, int64_t count) {
  return backend::scratch<T>(cpu_memory(), slot, size_t(count));
}

template <typename T>
int64_t elements(const TensorView<T>& t, const char* name) {
  return detail::checked_product(t.shape, name);
}

}  // namespace

template <typename T>
void block_summaries(const Options& options, TensorView<const T> k, TensorView<const T> v,
                     TensorView<T> summaries) {
  const char* fn = "mhla::block_summaries";
  const ValidatedCall call(summaries_problem(fn, options, k, v), options.layout);
  const Problem& p = call.problem();
  detail::check_output(fn, "summaries", summaries, summary_shape(p, p.blocks));
  cpu::CpuAttention<T>(p, nullptr).summaries(k.data, v.data, summaries.data);
}

template <typename T>
void mix_summaries(const Options& options, TensorView<const T> w, TensorView<const T> summaries,
                   TensorView<T> mixed, int64_t first_block) {
  const char* fn = "mhla::mix_summaries";
  const Problem p = mix_problem(fn, options, w, summaries, mixed.shape, mixed.data, first_block);
  cpu::CpuAttention<T>(p, w.data).mix(summaries.data, mixed.data);
}

template <typename T>
void read_out(const Options& options, TensorView<const T> q, TensorView<const T> k,
              TensorView<const T> v, TensorView<const T> w, TensorView<const T> mixed,
              TensorView<T> o, int64_t first_block) {
  const char* fn = "mhla::read_out";
  const ValidatedCall call(read_out_problem(fn, options, q, k, v, w, mixed, first_block),
                           options.layout);
  const Problem& p = call.problem();
  detail::check_output(fn, "o", o, detail::v_shape(p));
  if (!cpu::CpuAttention<T>(p, w.data).outputs(q.data, k.data, v.data, mixed.data, o.data))
    detail::report_non_finite_output(fn, p, q, k, v, o);
}

template <typename T>
void block_summaries_backward(const Options& options, TensorView<const T> k, TensorView<const T> v,
                              TensorView<const T> grad_summaries, TensorView<T> grad_k,
                              TensorView<T> grad_v) {
  const char* fn = "mhla::block_summaries_backward";
  const ValidatedCall call(summaries_problem(fn, options, k, v), options.layout);
  const Problem& p = call.problem();
  detail::check_output(fn, "grad_summaries", grad_summaries, summary_shape(p, p.blocks));
  detail::check_output(fn, "grad_k", grad_k, detail::q_shape(p));
  detail::check_output(fn, "grad_v", grad_v, detail::v_shape(p));
  const int64_t nk = elements(grad_k, "grad_k"), nv = elements(grad_v, "grad_v");
  T* dk = gradient_scratch<T>(Scratch::token_grad_k, nk);
  T* dv = gradient_scratch<T>(Scratch::token_grad_v, nv);
  cpu::CpuAttention<T>(p, nullptr).key_value_gradients(k.data, v.data, grad_summaries.data, dk, dv);
  backend::add(cpu_memory(), dk, nk, grad_k.data);
  backend::add(cpu_memory(), dv, nv, grad_v.data);
}

template <typename T>
void mix_summaries_backward(const Options& options, TensorView<const T> w,
                            TensorView<const T> summaries, TensorView<const T> grad_mixed,
                            TensorView<T> grad_summaries, TensorView<T> grad_w,
                            int64_t first_block) {
  const char* fn = "mhla::mix_summaries_backward";
  const Problem p =
      mix_problem(fn, options, w, summaries, grad_mixed.shape, grad_mixed.data, first_block);
  detail::check_output(fn, "grad_summaries", grad_summaries, summaries.shape);
  detail::check_output(fn, "grad_w", grad_w, w.shape);
  const int64_t n = elements(summaries, "summaries");
  T* ds = gradient_scratch<T>(Scratch::summaries_grad, n);
  // Adds to grad_w; the causal in-block dW[i, i] is read_out_backward's.
  cpu::CpuAttention<T>(p, w.data).mix_backward(grad_mixed.data, summaries.data, ds, grad_w.data);
  backend::add(cpu_memory(), ds, n, grad_summaries.data);
}

template <typename T>
void read_out_backward(const Options& options, TensorView<const T> q, TensorView<const T> k,
                       TensorView<const T> v, TensorView<const T> w, TensorView<const T> mixed,
                       TensorView<const T> o, TensorView<const T> grad_o, TensorView<T> grad_q,
                       TensorView<T> grad_k, TensorView<T> grad_v, TensorView<T> grad_mixed,
                       TensorView<T> grad_w, int64_t first_block) {
  const char* fn = "mhla::read_out_backward";
  const ValidatedCall call(read_out_problem(fn, options, q, k, v, w, mixed, first_block),
                           options.layout);
  const Problem& p = call.problem();
  detail::check_output(fn, "o", o, detail::v_shape(p));
  detail::check_gradients(fn, p, grad_o, grad_q, grad_k, grad_v);
  detail::check_output(fn, "grad_mixed", grad_mixed, mixed.shape);
  detail::check_output(fn, "grad_w", grad_w, w.shape);
  // The kernels write the gradients here; they are then added to the caller's.
  const int64_t nmixed = elements(mixed, "mixed"), nq = elements(grad_q, "grad_q"),
                nv = elements(grad_v, "grad_v");
  T* dmixed = gradient_scratch<T>(Scratch::summaries_grad, nmixed);
  T* dq = gradient_scratch<T>(Scratch::token_grad_q, nq);
  T* dk = p.causal ? gradient_scratch<T>(Scratch::token_grad_k, nq) : nullptr;
  T* dv = p.causal ? gradient_scratch<T>(Scratch::token_grad_v, nv) : nullptr;
  // The causal in-block dW[i, i] is added to grad_w directly.
  const bool finite = cpu::CpuAttention<T>(p, w.data).output_gradients(
      q.data, k.data, v.data, grad_o.data, mixed.data, dmixed, dq, dk, dv, grad_w.data);
  backend::add(cpu_memory(), dq, nq, grad_q.data);
  backend::add(cpu_memory(), dmixed, nmixed, grad_mixed.data);
  if (p.causal) {
    backend::add(cpu_memory(), dk, nq, grad_k.data);
    backend::add(cpu_memory(), dv, nv, grad_v.data);
  }
  if (!finite)
    detail::report_non_finite_gradients(fn, p, q, k, v, o, grad_o, grad_q, grad_k, grad_v);
}

template <typename T>
void forward_piece(const Options& options, TensorView<const T> q, TensorView<const T> k,
                   TensorView<const T> v, TensorView<const T> w, TensorView<const T> state_in,
                   TensorView<T> o, TensorView<T> state_out) {
  const char* fn = "mhla::forward_piece";
  if (options.masking == Masking::none)
    fail(fn,
         "a piece of a sequence needs causal or block_causal masking (with masking none, "
         "every block reads the blocks after it too)");
  const AttentionDims dims = detail::check_qkv(fn, q, k, v);
  Problem problem = check_tokens(fn, options, dims);
  // The state before the piece: [B, H, P, Dk, Dv + 1]; P = 0 is the empty state.
  detail::check_device(fn, "state_in", state_in.device);
  if (state_in.shape.size() != 5 || state_in.shape[2] < 0)
    fail(fn, "state_in must have rank 5 [B, H, P, Dk, Dv + 1], got shape " +
                 shape_to_string(state_in.shape));
  const int64_t before = state_in.shape[2];
  detail::check_shape_equals(fn, "state_in", state_in.shape, summary_shape(dims, before),
                             "(the summaries of the P blocks before the piece)");
  if (before > 0)
    detail::check_tensor(fn, "state_in", state_in.data, state_in.shape, 5, kSummaryHint);
  const int64_t m = problem.blocks, total = before + m;
  detail::check_output(fn, "state_out", state_out, summary_shape(dims, total));
  check_call_mixing(fn, options, w, before, total, problem);
  detail::check_output(fn, "o", o, detail::v_shape(dims));
  const ValidatedCall call(std::move(problem), options.layout);
  const Problem& p = call.problem();

  // state_out = state_in followed by the piece's summaries, per (batch, head).
  const cpu::CpuAttention<T> kernels(p, w.data);
  const int64_t x = dims.dk * (dims.dv + 1), slices = dims.batch * dims.heads;
  T* piece = gradient_scratch<T>(Scratch::summaries, slices * m * x);
  kernels.summaries(k.data, v.data, piece);
  for (int64_t bh = 0; bh < slices; ++bh) {
    T* dst = state_out.data + bh * total * x;
    if (before > 0) std::copy_n(state_in.data + bh * before * x, before * x, dst);
    std::copy_n(piece + bh * m * x, m * x, dst + before * x);
  }
  T* mixed = gradient_scratch<T>(Scratch::mixed, slices * m * x);
  kernels.mix(state_out.data, mixed);
  if (!kernels.outputs(q.data, k.data, v.data, mixed, o.data))
    detail::report_non_finite_output(fn, p, q, k, v, o);
}

#define MHLA_INSTANTIATE_PHASES(T)                                                                 \
  template void block_summaries<T>(const Options&, TensorView<const T>, TensorView<const T>,       \
                                   TensorView<T>);                                                 \
  template void mix_summaries<T>(const Options&, TensorView<const T>, TensorView<const T>,         \
                                 TensorView<T>, int64_t);                                          \
  template void read_out<T>(const Options&, TensorView<const T>, TensorView<const T>,              \
                            TensorView<const T>, TensorView<const T>, TensorView<const T>,         \
                            TensorView<T>, int64_t);                                               \
  template void block_summaries_backward<T>(const Options&, TensorView<const T>,                   \
                                            TensorView<const T>, TensorView<const T>,              \
                                            TensorView<T>, TensorView<T>);                         \
  template void mix_summaries_backward<T>(const Options&, TensorView<const T>,                     \
                                          TensorView<const T>, TensorView<const T>, TensorView<T>, \
                                          TensorView<T>, int64_t);                                 \
  template void read_out_backward<T>(                                                              \
      const Options&, TensorView<const T>, TensorView<const T>, TensorView<const T>,               \
      TensorView<const T>, TensorView<const T>, TensorView<const T>, TensorView<const T>,          \
      TensorView<T>, TensorView<T>, TensorView<T>, TensorView<T>, TensorView<T>, int64_t);         \
  template void forward_piece<T>(const Options&, TensorView<const T>, TensorView<const T>,         \
                                 TensorView<const T>, TensorView<const T>, TensorView<const T>,    \
                                 TensorView<T>, TensorView<T>);
MHLA_INSTANTIATE_PHASES(float)
MHLA_INSTANTIATE_PHASES(double)
#undef MHLA_INSTANTIATE_PHASES

}  // namespace mhla
