// Public MHLA entry points: validate once, then run the CPU backend's chunked
// kernel with the mixer (dense or Toeplitz W) the options ask for.
#include "mhla/operator.hpp"
#include "core/finite_results.hpp"
#include "core/saved_summaries_check.hpp"
#include "cpu/chunked_attention.hpp"
#include "cpu/simd/isa.hpp"
#include "cpu/workspace.hpp"

#include <algorithm>

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
  detail::Problem p = detail::validate_mhla(fn, options, q, k, v, w);
  const detail::BlockTable table(options.layout);
  p.table = table.view();
  detail::check_output(fn, "o", o, detail::v_shape(p.dims));
  const bool save_summaries = check_saved(fn, "saved_summaries", p, saved_summaries);
  const bool save_mixed = check_saved(fn, "saved_mixed", p, saved_mixed);
  const auto mixer = cpu::make_mixer(p, w.data);
  const bool finite = cpu::ChunkedAttention<T>(p, *mixer).forward(
      q.data, k.data, v.data, o.data, save_summaries ? saved_summaries.data : nullptr,
      save_mixed ? saved_mixed.data : nullptr);
  if (!finite) detail::report_non_finite_output(fn, p, q, k, v, o);
}

template <typename T>
void backward(const Options& options, TensorView<const T> q, TensorView<const T> k,
              TensorView<const T> v, TensorView<const T> w, TensorView<const T> o,
              TensorView<const T> grad_o, TensorView<T> grad_q, TensorView<T> grad_k,
              TensorView<T> grad_v, TensorView<T> grad_w, TensorView<const T> saved_summaries,
              TensorView<const T> saved_mixed) {
  const char* fn = "mhla::backward";
  detail::Problem p = detail::validate_mhla(fn, options, q, k, v, w);
  const detail::BlockTable table(options.layout);
  p.table = table.view();
  detail::check_output(fn, "o", o, detail::v_shape(p.dims));
  detail::check_gradients(fn, p.dims, grad_o, grad_q, grad_k, grad_v);
  detail::check_output(fn, "grad_w", grad_w, w.shape);
  const bool saved = check_saved(fn, "saved_summaries", p, saved_summaries);
  if (saved) detail::check_saved_summaries_match(fn, p, k.data, v.data, saved_summaries.data);
  const bool saved_mix = check_saved(fn, "saved_mixed", p, saved_mixed);
  if (saved_mix)
    detail::check_saved_mixed_match(fn, p, k.data, v.data, w.data, saved_mixed.data,
                                    saved ? saved_summaries.data : nullptr);
  const auto mixer = cpu::make_mixer(p, w.data);
  // The kernel adds to grad_w.
  std::fill(grad_w.data, grad_w.data + detail::checked_product(grad_w.shape, "grad_w"), T(0));
  const bool finite = cpu::ChunkedAttention<T>(p, *mixer).backward(
      q.data, k.data, v.data, o.data, grad_o.data, grad_q.data, grad_k.data, grad_v.data,
      grad_w.data, saved ? saved_summaries.data : nullptr, saved_mix ? saved_mixed.data : nullptr);
  // grad_w is small ([H,] M, M) and written by the mixer: scanned here.
  if (!finite ||
      detail::first_non_finite(grad_w.data, detail::checked_product(grad_w.shape, "grad_w")) >= 0)
    detail::report_non_finite_gradients(fn, p, q, k, v, o, grad_o, grad_q, grad_k, grad_v, grad_w);
}

void release_scratch() { cpu::release_scratch_buffers(); }

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
                            TensorView<T>, TensorView<const T>, TensorView<const T>);
MHLA_INSTANTIATE_OPERATOR(float)
MHLA_INSTANTIATE_OPERATOR(double)
#undef MHLA_INSTANTIATE_OPERATOR

}  // namespace mhla
