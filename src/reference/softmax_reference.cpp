// Dense softmax attention in double: the reference for the tiled baseline.
//   P = softmax(q k^T * scale) over visible keys, o = P v.
#include <cmath>
#include <limits>
#include <vector>

#include "core/allocation.hpp"
#include "core/validate.hpp"
#include "mhla/reference.hpp"
#include "reference/indexing.hpp"

namespace mhla::reference {
namespace {

detail::AttentionDims validate(const char* fn, const SoftmaxOptions& options,
                               const TensorView<const double>& q, const TensorView<const double>& k,
                               const TensorView<const double>& v) {
  const auto d = detail::check_qkv(fn, q, k, v);
  if (options.scale && !std::isfinite(*options.scale))
    detail::fail(fn, "options.scale must be finite");
  return d;
}

std::vector<double> probabilities(const SoftmaxOptions& options, const detail::AttentionDims& d,
                                  const double* q, const double* k, int64_t b, int64_t h) {
  const Indexer at{d.tokens, d.heads};
  const double scale = options.scale.value_or(1.0 / std::sqrt(double(d.dk)));
  const int64_t n = d.tokens;
  std::vector<double> p = detail::allocating(
      "mhla::reference", "the N x N softmax matrix of N = " + std::to_string(n) + " tokens",
      double(n) * double(n) * sizeof(double),
      [&] { return std::vector<double>(size_t(n) * size_t(n), 0.0); });
  for (int64_t t = 0; t < n; ++t) {
    const int64_t last = options.causal ? t : n - 1;
    double max_logit = -std::numeric_limits<double>::infinity();
    for (int64_t s = 0; s <= last; ++s) {
      double dot = 0;
      for (int64_t r = 0; r < d.dk; ++r) dot += q[at(b, t, h, d.dk) + r] * k[at(b, s, h, d.dk) + r];
      p[t * n + s] = dot * scale;
      max_logit = std::max(max_logit, p[t * n + s]);
    }
    double sum = 0;
    for (int64_t s = 0; s <= last; ++s) sum += (p[t * n + s] = std::exp(p[t * n + s] - max_logit));
    for (int64_t s = 0; s <= last; ++s) p[t * n + s] /= sum;
  }
  return p;
}

}  // namespace

std::vector<double> softmax_attention_matrix(const SoftmaxOptions& options,
                                             TensorView<const double> q, TensorView<const double> k,
                                             int64_t batch, int64_t head) {
  const char* fn = "mhla::reference::softmax_attention_matrix";
  const auto d = validate(fn, options, q, k, q);
  if (batch < 0 || batch >= d.batch || head < 0 || head >= d.heads)
    detail::fail(fn, "batch/head out of range for q of shape " + shape_to_string(q.shape));
  return probabilities(options, d, q.data, k.data, batch, head);
}

void softmax_forward(const SoftmaxOptions& options, TensorView<const double> q,
                     TensorView<const double> k, TensorView<const double> v, TensorView<double> o) {
  const char* fn = "mhla::reference::softmax_forward";
  const auto d = validate(fn, options, q, k, v);
  detail::check_output(fn, "o", o, detail::v_shape(d));
  const Indexer at{d.tokens, d.heads};
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      const auto p = probabilities(options, d, q.data, k.data, b, h);
      for (int64_t t = 0; t < d.tokens; ++t)
        for (int64_t e = 0; e < d.dv; ++e) {
          double acc = 0;
          for (int64_t s = 0; s < d.tokens; ++s)
            acc += p[t * d.tokens + s] * v.data[at(b, s, h, d.dv) + e];
          o.data[at(b, t, h, d.dv) + e] = acc;
        }
    }
}

void softmax_backward(const SoftmaxOptions& options, TensorView<const double> q,
                      TensorView<const double> k, TensorView<const double> v,
                      TensorView<const double> grad_o, TensorView<double> grad_q,
                      TensorView<double> grad_k, TensorView<double> grad_v) {
  const char* fn = "mhla::reference::softmax_backward";
  const auto d = validate(fn, options, q, k, v);
  detail::check_gradients(fn, d, grad_o, grad_q, grad_k, grad_v);
  const Indexer at{d.tokens, d.heads};
  const double scale = options.scale.value_or(1.0 / std::sqrt(double(d.dk)));
  const int64_t n = d.tokens;
  std::fill(grad_q.data, grad_q.data + d.batch * n * d.heads * d.dk, 0.0);
  std::fill(grad_k.data, grad_k.data + d.batch * n * d.heads * d.dk, 0.0);
  std::fill(grad_v.data, grad_v.data + d.batch * n * d.heads * d.dv, 0.0);
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      const auto p = probabilities(options, d, q.data, k.data, b, h);
      for (int64_t t = 0; t < n; ++t) {
        const double* g = &grad_o.data[at(b, t, h, d.dv)];
        // o_t = sum_s P[t,s] v_s:  dP[t,s] = g_t . v_s,  dv_s += P[t,s] g_t.
        std::vector<double> dp(n, 0.0);
        double row_dot = 0;  // sum_s P[t,s] dP[t,s]
        for (int64_t s = 0; s < n; ++s) {
          for (int64_t e = 0; e < d.dv; ++e) {
            dp[s] += g[e] * v.data[at(b, s, h, d.dv) + e];
            grad_v.data[at(b, s, h, d.dv) + e] += p[t * n + s] * g[e];
          }
          row_dot += p[t * n + s] * dp[s];
        }
        // Softmax: dlogit[t,s] = P[t,s] (dP[t,s] - row_dot); logit = scale q_t . k_s.
        for (int64_t s = 0; s < n; ++s) {
          const double dl = p[t * n + s] * (dp[s] - row_dot) * scale;
          for (int64_t r = 0; r < d.dk; ++r) {
            grad_q.data[at(b, t, h, d.dk) + r] += dl * k.data[at(b, s, h, d.dk) + r];
            grad_k.data[at(b, s, h, d.dk) + r] += dl * q.data[at(b, t, h, d.dk) + r];
          }
        }
      }
    }
}

}  // namespace mhla::reference
