// Public MHLA entry points: validate once, then run the CPU backend's chunked
// kernel with the mixer (dense or Toeplitz W) the options ask for.
#include "mhla/operator.hpp"
#include "api/private_state_backward.hpp"
#include "core/finite_results.hpp"
#include "core/saved_state_check.hpp"
#include "cpu/bf16_forward.hpp"
#include "cpu/chunked_attention.hpp"
#include "cpu/simd/bf16_products.hpp"
#include "cpu/simd/isa.hpp"
#include "cpu/workspace.hpp"

#include <algorithm>
#include <type_traits>

namespace mhla {

namespace {

std::vector<int64_t> summaries_shape(const detail::AttentionDims& d, int64_t blocks) {
  return {d.batch, d.heads, blocks, d.dk, d.dv + 1};
}

// An optional saved array (saved_summaries, saved_mixed): absent (no data, no
// shape), or exactly the summaries' shape.
template <typename T>
bool check_saved(const char* fn, const char* name, const detail::Problem& p,
                 const TensorView<T>& saved) {
  if (saved.data == nullptr && saved.shape.empty()) return false;
  detail::check_output(fn, name, saved, summaries_shape(p.dims, p.blocks));
  return true;
}

// The opening of every MHLA entry point here, for float and bfloat16 tokens
// alike: the validated problem, the block table it points into, o checked.
// Neither copied nor moved (problem.table views table).
struct CheckedCall {
  template <typename S, typename W, typename O>
  CheckedCall(const char* fn, const Options& options, const TensorView<const S>& q,
              const TensorView<const S>& k, const TensorView<const S>& v,
              const TensorView<const W>& w, const TensorView<O>& o)
      : problem(detail::validate_mhla(fn, options, q, k, v, w)), table(options.layout) {
    problem.table = table.view();
    detail::check_output(fn, "o", o, detail::v_shape(problem.dims));
  }
  CheckedCall(const CheckedCall&) = delete;
  CheckedCall& operator=(const CheckedCall&) = delete;

  detail::Problem problem;  // first: validated before the table is built
  const detail::BlockTable table;
};

}  // namespace

std::vector<int64_t> saved_summaries_shape(const Options& options,
                                           const std::vector<int64_t>& q_shape,
                                           const std::vector<int64_t>& v_shape) {
  const char* fn = "mhla::saved_summaries_shape";
  // Shapes only: any non-null address passes the pointer checks.
  const int marker = 0;
  const detail::AttentionDims d =
      detail::check_qkv(fn, &marker, q_shape, &marker, q_shape, &marker, v_shape);
  detail::check_layout_tokens(fn, options.layout, d.tokens);
  return summaries_shape(d, options.layout.num_blocks());
}

template <typename T>
void forward(const Options& options, TensorView<const T> q, TensorView<const T> k,
             TensorView<const T> v, TensorView<const T> w, TensorView<T> o,
             TensorView<T> saved_summaries, TensorView<T> saved_mixed) {
  const char* fn = "mhla::forward";
  const CheckedCall call(fn, options, q, k, v, w, o);
  const detail::Problem& p = call.problem;
  const bool save_summaries = check_saved(fn, "saved_summaries", p, saved_summaries);
  const bool save_mixed = check_saved(fn, "saved_mixed", p, saved_mixed);
  const auto mixer = cpu::make_mixer(p, w.data);
  const bool finite = cpu::ChunkedAttention<T>(p, *mixer).forward(
      q.data, k.data, v.data, o.data, save_summaries ? saved_summaries.data : nullptr,
      save_mixed ? saved_mixed.data : nullptr);
  if (!finite) detail::report_non_finite_output(fn, p, q, k, v, o);
}

namespace {

// backward<T>'s body, also for bfloat16 token tensors (S) with float T;
// `rounding` widens the saved arrays' fingerprint tolerance for summaries from
// bfloat16 products (core/saved_state_check.hpp): one rounding of each term
// of the summaries, three of the mixed summaries' (the mix rounds w and the
// summaries once more). A kernel flag of
// non-finite results is reported when S is T; with bfloat16 it returns false
// for the caller to report through float.
template <typename S, typename T>
bool run_backward(const Options& options, TensorView<const S> q, TensorView<const S> k,
                  TensorView<const S> v, TensorView<const T> w, TensorView<const S> o,
                  TensorView<const S> grad_o, TensorView<S> grad_q, TensorView<S> grad_k,
                  TensorView<S> grad_v, TensorView<T> grad_w, TensorView<const T> saved_summaries,
                  TensorView<const T> saved_mixed, double rounding, bool verify) {
  const char* fn = "mhla::backward";
  const CheckedCall call(fn, options, q, k, v, w, o);
  const detail::Problem& p = call.problem;
  detail::check_gradients(fn, p.dims, grad_o, grad_q, grad_k, grad_v);
  detail::check_output(fn, "grad_w", grad_w, w.shape);
  const bool saved = check_saved(fn, "saved_summaries", p, saved_summaries);
  const bool saved_mix = check_saved(fn, "saved_mixed", p, saved_mixed);
  if (verify && (saved || saved_mix)) {
    const detail::Fingerprints prints = detail::fingerprints(p, k.data, v.data);
    if (saved) detail::check_saved_summaries_match(fn, p, prints, saved_summaries.data, rounding);
    if (saved_mix)
      detail::check_saved_mixed_match(fn, p, prints, w.data, saved_mixed.data, 3 * rounding);
  }
  const auto mixer = cpu::make_mixer(p, w.data);
  // The kernel adds to grad_w.
  std::fill(grad_w.data, grad_w.data + detail::checked_product(grad_w.shape, "grad_w"), T(0));
  const bool finite =
      cpu::ChunkedAttention<T>(p, *mixer).backward(
          q.data, k.data, v.data, grad_o.data, grad_q.data, grad_k.data, grad_v.data, grad_w.data,
          saved ? saved_summaries.data : nullptr, saved_mix ? saved_mixed.data : nullptr) &&
      // grad_w is small ([H,] M, M) and written by the mixer: scanned here.
      detail::first_non_finite(grad_w.data, detail::checked_product(grad_w.shape, "grad_w")) < 0;
  if constexpr (std::is_same_v<S, T>) {
    if (!finite)
      detail::report_non_finite_gradients(fn, p, q, k, v, o, grad_o, grad_q, grad_k, grad_v,
                                          grad_w);
  }
  return finite;
}

// A float copy of a bfloat16 tensor (exact) in the calling thread's scratch:
// fresh buffers cost more in page faults than the copies (a bfloat16 backward
// at N = 65536 took 560 ms with them, against 150 for the float backward).
TensorView<const float> widened(const TensorView<const bfloat16>& x, cpu::Scratch slot) {
  const int64_t n = detail::checked_product(x.shape, "x");
  float* dst = cpu::scratch<float>(slot, size_t(n));
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = to_float(x.data[i]);
  return {dst, x.shape, x.device};
}

// Elements of a checked buffer.
template <typename T>
int64_t elements(const TensorView<T>& t) {
  return detail::checked_product(t.shape, "buffer");
}

// dst = src rounded to bfloat16, n values.
void narrow(const float* src, int64_t n, bfloat16* dst) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = to_bfloat16(src[i]);
}

// What one rounding to bfloat16 adds to a term of a saved array's entries
// (2^-8, half a unit in its 8th significant bit): phi(k) in the summaries,
// and also w and the summaries in the mix.
constexpr double kBf16Rounding = 0x1p-8;

}  // namespace

namespace detail {

template <typename T>
void backward(SavedArrays saved, const Options& options, TensorView<const T> q,
              TensorView<const T> k, TensorView<const T> v, TensorView<const T> w,
              TensorView<const T> o, TensorView<const T> grad_o, TensorView<T> grad_q,
              TensorView<T> grad_k, TensorView<T> grad_v, TensorView<T> grad_w,
              TensorView<const T> saved_summaries, TensorView<const T> saved_mixed) {
  run_backward<T, T>(options, q, k, v, w, o, grad_o, grad_q, grad_k, grad_v, grad_w,
                     saved_summaries, saved_mixed, 0.0, saved == SavedArrays::from_outside);
}

void backward(SavedArrays saved, const Options& options, TensorView<const bfloat16> q,
              TensorView<const bfloat16> k, TensorView<const bfloat16> v, TensorView<const float> w,
              TensorView<const bfloat16> o, TensorView<const bfloat16> grad_o,
              TensorView<bfloat16> grad_q, TensorView<bfloat16> grad_k, TensorView<bfloat16> grad_v,
              TensorView<float> grad_w, TensorView<const float> saved_summaries,
              TensorView<const float> saved_mixed) {
  const bool verify = saved == SavedArrays::from_outside;
  const char* fn = "mhla::backward";
  // The bfloat16 kernels read and write the bfloat16 tensors in place (not in
  // causal mode: its in-block gradients are parked in the outputs between
  // phases). A flag of non-finite results is checked, and reported, by the
  // float path below.
  if (options.masking != Masking::causal && cpu::simd::bf16_products_available() &&
      run_backward<bfloat16, float>(options, q, k, v, w, o, grad_o, grad_q, grad_k, grad_v, grad_w,
                                    saved_summaries, saved_mixed, kBf16Rounding, verify))
    return;
  // The float kernels on widened copies (the bfloat16 buffers are checked
  // here; the float call checks the rest).
  const detail::AttentionDims d = detail::check_qkv(fn, q, k, v);
  detail::check_output(fn, "o", o, detail::v_shape(d));
  detail::check_gradients(fn, d, grad_o, grad_q, grad_k, grad_v);
  const int64_t nq = elements(grad_q), nv = elements(grad_v);
  float* gq = cpu::scratch<float>(cpu::Scratch::token_grad_q, size_t(nq));
  float* gk = cpu::scratch<float>(cpu::Scratch::token_grad_k, size_t(nq));
  float* gv = cpu::scratch<float>(cpu::Scratch::token_grad_v, size_t(nv));
  run_backward<float, float>(
      options, widened(q, cpu::Scratch::widened_q), widened(k, cpu::Scratch::widened_k),
      widened(v, cpu::Scratch::widened_v), w, widened(o, cpu::Scratch::widened_o),
      widened(grad_o, cpu::Scratch::widened_grad_o), {gq, grad_q.shape}, {gk, grad_k.shape},
      {gv, grad_v.shape}, grad_w, saved_summaries, saved_mixed, kBf16Rounding, verify);
  narrow(gq, nq, grad_q.data);
  narrow(gk, nq, grad_k.data);
  narrow(gv, nv, grad_v.data);
}

}  // namespace detail

template <typename T>
void backward(const Options& options, TensorView<const T> q, TensorView<const T> k,
              TensorView<const T> v, TensorView<const T> w, TensorView<const T> o,
              TensorView<const T> grad_o, TensorView<T> grad_q, TensorView<T> grad_k,
              TensorView<T> grad_v, TensorView<T> grad_w, TensorView<const T> saved_summaries,
              TensorView<const T> saved_mixed) {
  detail::backward<T>(detail::SavedArrays::from_outside, options, q, k, v, w, o, grad_o, grad_q,
                      grad_k, grad_v, grad_w, saved_summaries, saved_mixed);
}

void backward(const Options& options, TensorView<const bfloat16> q, TensorView<const bfloat16> k,
              TensorView<const bfloat16> v, TensorView<const float> w, TensorView<const bfloat16> o,
              TensorView<const bfloat16> grad_o, TensorView<bfloat16> grad_q,
              TensorView<bfloat16> grad_k, TensorView<bfloat16> grad_v, TensorView<float> grad_w,
              TensorView<const float> saved_summaries, TensorView<const float> saved_mixed) {
  detail::backward(detail::SavedArrays::from_outside, options, q, k, v, w, o, grad_o, grad_q,
                   grad_k, grad_v, grad_w, saved_summaries, saved_mixed);
}

void forward(const Options& options, TensorView<const bfloat16> q, TensorView<const bfloat16> k,
             TensorView<const bfloat16> v, TensorView<const float> w, TensorView<bfloat16> o,
             TensorView<float> saved_summaries, TensorView<float> saved_mixed) {
  const char* fn = "mhla::forward";
  const CheckedCall call(fn, options, q, k, v, w, o);
  const detail::Problem& p = call.problem;
  const bool save_summaries = check_saved(fn, "saved_summaries", p, saved_summaries);
  const bool save_mixed = check_saved(fn, "saved_mixed", p, saved_mixed);
  if (p.causal || !cpu::simd::bf16_products_available()) {
    // The float kernels on widened copies: the causal in-block products have
    // no bfloat16 form, nor has a CPU without AVX512-BF16.
    float* of = cpu::scratch<float>(cpu::Scratch::widened_o, size_t(elements(o)));
    forward<float>(options, widened(q, cpu::Scratch::widened_q),
                   widened(k, cpu::Scratch::widened_k), widened(v, cpu::Scratch::widened_v), w,
                   {of, o.shape}, saved_summaries, saved_mixed);
    narrow(of, elements(o), o.data);
    return;
  }
  const auto mixer = cpu::make_mixer(p, w.data);
  const bool finite = cpu::Bf16Forward(p, *mixer).forward(
      q.data, k.data, v.data, o.data, save_summaries ? saved_summaries.data : nullptr,
      save_mixed ? saved_mixed.data : nullptr);
  if (finite) return;
  // Rare: the float report, on float copies.
  const TensorView<const float> of = widened(o, cpu::Scratch::widened_o);
  detail::report_non_finite_output(
      fn, p, widened(q, cpu::Scratch::widened_q), widened(k, cpu::Scratch::widened_k),
      widened(v, cpu::Scratch::widened_v), TensorView<float>{const_cast<float*>(of.data), o.shape});
}

void release_scratch() { cpu::release_scratch_buffers(); }

bool bf16_products() { return cpu::simd::bf16_products_available(); }

std::string kernel_isa() { return cpu::simd::target_name(cpu::simd::active_target()); }

FlopCount mhla_flops(int64_t batch, int64_t tokens, int64_t heads, int64_t dk, int64_t dv,
                     int64_t blocks, Masking masking, int64_t block_size) {
  const double n = double(tokens), m = double(blocks), dkdv = double(dk) * double(dv);
  double per_head = 0;
  if (masking == Masking::block_causal) {
    // summaries 2N DkDv, lower-triangular mix M(M+1) DkDv, outputs 2N DkDv.
    per_head = 4 * n * dkdv + m * (m + 1) * dkdv;
  } else if (masking == Masking::causal) {
    // summaries 2N DkDv, strictly-lower mix M(M-1) DkDv, inter-block outputs
    // 2N DkDv, in-block masked products N C (Dk + Dv) (half of each C x C tile).
    per_head = 4 * n * dkdv + m * (m - 1) * dkdv + n * double(block_size) * double(dk + dv);
  } else {
    // summaries 2N DkDv, mix 2M^2 DkDv, outputs 2N DkDv.
    per_head = 4 * n * dkdv + 2 * m * m * dkdv;
  }
  const double fwd = double(batch) * double(heads) * per_head;
  // Backward runs each forward GEMM twice (once per input operand).
  return {fwd, 2 * fwd};
}

#define MHLA_INSTANTIATE_OPERATOR(T)                                                               \
  template void forward<T>(const Options&, TensorView<const T>, TensorView<const T>,               \
                           TensorView<const T>, TensorView<const T>, TensorView<T>, TensorView<T>, \
                           TensorView<T>);                                                         \
  template void backward<T>(const Options&, TensorView<const T>, TensorView<const T>,              \
                            TensorView<const T>, TensorView<const T>, TensorView<const T>,         \
                            TensorView<const T>, TensorView<T>, TensorView<T>, TensorView<T>,      \
                            TensorView<T>, TensorView<const T>, TensorView<const T>);              \
  template void detail::backward<T>(detail::SavedArrays, const Options&, TensorView<const T>,      \
                                    TensorView<const T>, TensorView<const T>, TensorView<const T>, \
                                    TensorView<const T>, TensorView<const T>, TensorView<T>,       \
                                    TensorView<T>, TensorView<T>, TensorView<T>,                   \
                                    TensorView<const T>, TensorView<const T>);
MHLA_INSTANTIATE_OPERATOR(float)
MHLA_INSTANTIATE_OPERATOR(double)
#undef MHLA_INSTANTIATE_OPERATOR

}  // namespace mhla
