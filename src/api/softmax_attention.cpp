// The softmax baseline's entry points: validate once (CPU tensors only),
// then run the CPU's tiled kernel.
#include <cmath>

#include "core/finite_results.hpp"
#include "core/validate.hpp"
#include "cpu/softmax_kernel.hpp"
#include "mhla/baselines.hpp"

namespace mhla {
namespace {

template <typename T>
cpu::SoftmaxProblem validate(const char* fn, const SoftmaxOptions& options,
                             const TensorView<const T>& q, const TensorView<const T>& k,
                             const TensorView<const T>& v) {
  const detail::AttentionDims d = detail::check_qkv(fn, q, k, v);
  const double scale = options.scale.value_or(1.0 / std::sqrt(double(d.dk)));
  if (!std::isfinite(scale)) detail::fail(fn, "options.scale must be finite");
  return {d, scale, options.causal};
}

// Finite q, k and v give a finite o and lse unless the scores overflow
// (softmax_overflow_message); the results are scanned on the host, a pass as
// large as v's against the kernel's N^2 products.
template <typename T>
void check_finite_results(const char* fn, const cpu::SoftmaxProblem& x,
                          const TensorView<const T>& q, const TensorView<const T>& k,
                          const TensorView<const T>& v, const TensorView<T>& o,
                          const TensorView<T>& lse) {
  if (detail::first_non_finite(o.data, detail::checked_product(o.shape, "o")) < 0 &&
      detail::first_non_finite(lse.data, detail::checked_product(lse.shape, "lse")) < 0)
    return;
  std::vector<std::pair<std::string, double>> magnitudes;
  for (const auto& [name, t] : {std::pair{"q", q}, {"k", k}, {"v", v}}) {
    const int64_t n = detail::checked_product(t.shape, name);
    if (detail::first_non_finite(t.data, n) >= 0) return;  // NaN or inf in, NaN or inf out
    magnitudes.emplace_back(name, detail::largest_magnitude(t.data, n));
  }
  detail::fail(fn, detail::softmax_overflow_message(magnitudes, x.scale,
                                                    sizeof(T) == 4 ? "float32" : "float64"));
}

}  // namespace

template <typename T>
void softmax_attention_forward(const SoftmaxOptions& options, TensorView<const T> q,
                               TensorView<const T> k, TensorView<const T> v, TensorView<T> o,
                               TensorView<T> lse) {
  const char* fn = "mhla::softmax_attention_forward";
  const cpu::SoftmaxProblem x = validate(fn, options, q, k, v);
  detail::check_output(fn, "o", o, detail::v_shape(x.d));
  detail::check_output(fn, "lse", lse, {x.d.batch, x.d.heads, x.d.tokens});
  cpu::softmax_forward(x, q.data, k.data, v.data, o.data, lse.data);
  check_finite_results(fn, x, q, k, v, o, lse);
}

template <typename T>
void softmax_attention_backward(const SoftmaxOptions& options, TensorView<const T> q,
                                TensorView<const T> k, TensorView<const T> v, TensorView<const T> o,
                                TensorView<const T> lse, TensorView<const T> grad_o,
                                TensorView<T> grad_q, TensorView<T> grad_k, TensorView<T> grad_v) {
  const char* fn = "mhla::softmax_attention_backward";
  const cpu::SoftmaxProblem x = validate(fn, options, q, k, v);
  detail::check_output(fn, "o", o, detail::v_shape(x.d));
  detail::check_output(fn, "lse", lse, {x.d.batch, x.d.heads, x.d.tokens});
  detail::check_gradients(fn, x.d, grad_o, grad_q, grad_k, grad_v);
  cpu::softmax_backward(x, q.data, k.data, v.data, o.data, lse.data, grad_o.data, grad_q.data,
                        grad_k.data, grad_v.data);
}

double softmax_flops_forward(int64_t batch, int64_t tokens, int64_t heads, int64_t dk, int64_t dv,
                             bool causal) {
  const double n = double(tokens);
  const double pairs = causal ? n * (n + 1) / 2 : n * n;
  return double(batch) * double(heads) * 2.0 * pairs * double(dk + dv);
}

#define MHLA_INSTANTIATE_SOFTMAX(T)                                                                \
  template void softmax_attention_forward<T>(const SoftmaxOptions&, TensorView<const T>,           \
                                             TensorView<const T>, TensorView<const T>,             \
                                             TensorView<T>, TensorView<T>);                        \
  template void softmax_attention_backward<T>(                                                     \
      const SoftmaxOptions&, TensorView<const T>, TensorView<const T>, TensorView<const T>,        \
      TensorView<const T>, TensorView<const T>, TensorView<const T>, TensorView<T>, TensorView<T>, \
      TensorView<T>);
MHLA_INSTANTIATE_SOFTMAX(float)
MHLA_INSTANTIATE_SOFTMAX(double)
#undef MHLA_INSTANTIATE_SOFTMAX

}  // namespace mhla
