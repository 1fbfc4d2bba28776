// Vanilla linear attention: the chunked kernel with a parameter-free all-ones
// mix (a sum, or a prefix sum when causal). The chunks only organise the work;
// the result does not depend on their size.
#include "backend/backend.hpp"
#include "core/finite_results.hpp"
#include "core/validated_call.hpp"
#include "mhla/baselines.hpp"

namespace mhla {
namespace {

// Causal chunks pay O(C^2) in-block work per chunk, so they stay small; a
// non-causal chunk only bounds the per-thread tiles.
int64_t chunk_size(bool causal) { return causal ? 64 : 256; }

// The problem of a validated call: the tokens in chunks, mixed by a sum.
template <typename T>
detail::ValidatedCall validate(const char* fn, const LinearAttentionOptions& options,
                               const TensorView<const T>& q, const TensorView<const T>& k,
                               const TensorView<const T>& v) {
  const detail::AttentionDims dims = detail::check_qkv(fn, q, k, v);
  if (options.masking == Masking::block_causal)
    detail::fail(fn,
                 "block_causal masking needs MHLA's block layout; linear attention has one "
                 "global summary (use none or causal)");
  detail::Problem p = detail::check_linear_options(fn, options, dims);
  TokenLayout chunks = TokenLayout::sequence(dims.tokens, chunk_size(p.causal));
  p.blocks = p.mixing_blocks = p.w_stride = chunks.num_blocks();
  return {std::move(p), std::move(chunks)};
}

}  // namespace

template <typename T>
void linear_attention_forward(const LinearAttentionOptions& options, TensorView<const T> q,
                              TensorView<const T> k, TensorView<const T> v, TensorView<T> o) {
  const char* fn = "mhla::linear_attention_forward";
  const detail::ValidatedCall call = validate(fn, options, q, k, v);
  const detail::Problem& p = call.problem();
  detail::check_output(fn, "o", o, detail::v_shape(p));
  const auto kernels =
      backend::backend_for(fn, "q", q.device).attention(p, static_cast<const T*>(nullptr));
  if (!kernels->forward(q.data, k.data, v.data, o.data, nullptr, nullptr))
    detail::report_non_finite_output(fn, p, q, k, v, o);
}

template <typename T>
void linear_attention_backward(const LinearAttentionOptions& options, TensorView<const T> q,
                               TensorView<const T> k, TensorView<const T> v, TensorView<const T> o,
                               TensorView<const T> grad_o, TensorView<T> grad_q,
                               TensorView<T> grad_k, TensorView<T> grad_v) {
  const char* fn = "mhla::linear_attention_backward";
  const detail::ValidatedCall call = validate(fn, options, q, k, v);
  const detail::Problem& p = call.problem();
  detail::check_output(fn, "o", o, detail::v_shape(p));
  detail::check_gradients(fn, p, grad_o, grad_q, grad_k, grad_v);
  const auto kernels =
      backend::backend_for(fn, "q", q.device).attention(p, static_cast<const T*>(nullptr));
  if (!kernels->backward(q.data, k.data, v.data, grad_o.data, grad_q.data, grad_k.data, grad_v.data,
                         nullptr, nullptr, nullptr))
    detail::report_non_finite_gradients(fn, p, q, k, v, o, grad_o, grad_q, grad_k, grad_v);
}

double linear_attention_flops_forward(int64_t batch, int64_t tokens, int64_t heads, int64_t dk,
                                      int64_t dv) {
  return 4.0 * double(batch) * double(heads) * double(tokens) * double(dk) * double(dv);
}

template void linear_attention_forward<float>(const LinearAttentionOptions&,
                                              TensorView<const float>, TensorView<const float>,
                                              TensorView<const float>, TensorView<float>);
template void linear_attention_forward<double>(const LinearAttentionOptions&,
                                               TensorView<const double>, TensorView<const double>,
                                               TensorView<const double>, TensorView<double>);
template void linear_attention_backward<float>(const LinearAttentionOptions&,
                                               TensorView<const float>, TensorView<const float>,
                                               TensorView<const float>, TensorView<const float>,
                                               TensorView<const float>, TensorView<float>,
                                               TensorView<float>, TensorView<float>);
template void linear_attention_backward<double>(const LinearAttentionOptions&,
                                                TensorView<const double>, TensorView<const double>,
                                                TensorView<const double>, TensorView<const double>,
                                                TensorView<const double>, TensorView<double>,
                                                TensorView<double>, TensorView<double>);

}  // namespace mhla
