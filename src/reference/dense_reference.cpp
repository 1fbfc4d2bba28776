// Dense reference: the explicit attention matrix, independent of the block
// summaries. For batch b and head h,
//   A[t,s] = W[blk(t), blk(s)] * phi(q_t) . phi(k_s)
//   (0 where s > t when causal, where blk(s) > blk(t) when block-causal)
//   normalized:   o_t = sum_s A[t,s] v_s / (sum_s A[t,s] + eps)
//   unnormalized: o_t = scale * sum_s A[t,s] v_s
// O(N^2 (Dk + Dv)) time and O(N^2) memory: small N only.
#include <vector>

#include "core/allocation.hpp"
#include "core/feature_map.hpp"
#include "core/validate.hpp"
#include "mhla/reference.hpp"
#include "reference/indexing.hpp"

namespace mhla::reference {
namespace {

using detail::feature;
using detail::feature_derivative;
using detail::Problem;

// Unnormalised scores A [N, N] of one (batch, head).
std::vector<double> scores(const Problem& p, const double* q, const double* k, const double* w,
                           int64_t b, int64_t h) {
  const auto& d = p;
  const Indexer at{d.tokens, d.heads};
  std::vector<double> a = detail::allocating(
      "mhla::reference",
      "the N x N attention matrix of N = " + std::to_string(d.tokens) + " tokens",
      double(d.tokens) * double(d.tokens) * sizeof(double),
      [&] { return std::vector<double>(size_t(d.tokens) * size_t(d.tokens), 0.0); });
  for (int64_t t = 0; t < d.tokens; ++t)
    for (int64_t s = 0; s < d.tokens; ++s) {
      if (!visible(p, t, s)) continue;
      double dot = 0;
      for (int64_t r = 0; r < d.dk; ++r)
        dot += feature(p.phi, q[at(b, t, h, d.dk) + r]) * feature(p.phi, k[at(b, s, h, d.dk) + r]);
      a[t * d.tokens + s] = mixing(p, w, h, p.layout->block_of(t), p.layout->block_of(s)) * dot;
    }
  return a;
}

// Row factor turning A into the effective matrix: 1/(rowsum + eps) or scale.
std::vector<double> row_factors(const Problem& p, const std::vector<double>& a) {
  const int64_t n = p.tokens;
  std::vector<double> f(n, p.scale);
  if (!p.normalize) return f;
  for (int64_t t = 0; t < n; ++t) {
    double den = p.eps;
    for (int64_t s = 0; s < n; ++s) den += a[t * n + s];
    f[t] = 1.0 / den;
  }
  return f;
}

}  // namespace

std::vector<double> mhla_attention_matrix(const Options& options, TensorView<const double> q,
                                          TensorView<const double> k, TensorView<const double> w,
                                          int64_t batch, int64_t head) {
  const char* fn = "mhla::reference::mhla_attention_matrix";
  // v is not needed; validate with q standing in for it.
  const Problem p = detail::validate_mhla(fn, options, q, k, q, w);
  if (batch < 0 || batch >= p.batch || head < 0 || head >= p.heads)
    detail::fail(fn, "batch " + std::to_string(batch) + " / head " + std::to_string(head) +
                         " out of range for q of shape " + shape_to_string(q.shape));
  std::vector<double> a = scores(p, q.data, k.data, w.data, batch, head);
  const std::vector<double> f = row_factors(p, a);
  const int64_t n = p.tokens;
  for (int64_t t = 0; t < n; ++t)
    for (int64_t s = 0; s < n; ++s) a[t * n + s] *= f[t];
  return a;
}

void dense_forward(const Options& options, TensorView<const double> q, TensorView<const double> k,
                   TensorView<const double> v, TensorView<const double> w, TensorView<double> o) {
  const char* fn = "mhla::reference::dense_forward";
  const Problem p = detail::validate_mhla(fn, options, q, k, v, w);
  detail::check_output(fn, "o", o, detail::v_shape(p));
  const auto& d = p;
  const Indexer at{d.tokens, d.heads};
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      const std::vector<double> a = scores(p, q.data, k.data, w.data, b, h);
      const std::vector<double> f = row_factors(p, a);
      for (int64_t t = 0; t < d.tokens; ++t)
        for (int64_t e = 0; e < d.dv; ++e) {
          double acc = 0;
          for (int64_t s = 0; s < d.tokens; ++s)
            acc += a[t * d.tokens + s] * v.data[at(b, s, h, d.dv) + e];
          o.data[at(b, t, h, d.dv) + e] = f[t] * acc;
        }
    }
}

void dense_backward(const Options& options, TensorView<const double> q, TensorView<const double> k,
                    TensorView<const double> v, TensorView<const double> w,
                    TensorView<const double> grad_o, TensorView<double> grad_q,
                    TensorView<double> grad_k, TensorView<double> grad_v,
                    TensorView<double> grad_w) {
  const char* fn = "mhla::reference::dense_backward";
  const Problem p = detail::validate_mhla(fn, options, q, k, v, w);
  const auto& d = p;
  detail::check_gradients(fn, d, grad_o, grad_q, grad_k, grad_v);
  detail::check_output(fn, "grad_w", grad_w, w.shape);
  const Indexer at{d.tokens, d.heads};
  const int64_t n = d.tokens;
  std::fill(grad_w.data, grad_w.data + detail::checked_product(grad_w.shape, "grad_w"), 0.0);
  std::fill(grad_q.data, grad_q.data + d.batch * n * d.heads * d.dk, 0.0);
  std::fill(grad_k.data, grad_k.data + d.batch * n * d.heads * d.dk, 0.0);
  std::fill(grad_v.data, grad_v.data + d.batch * n * d.heads * d.dv, 0.0);

  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      const std::vector<double> a = scores(p, q.data, k.data, w.data, b, h);
      const std::vector<double> f = row_factors(p, a);
      for (int64_t t = 0; t < n; ++t) {
        const double* g = &grad_o.data[at(b, t, h, d.dv)];
        // o_t = f_t sum_s A[t,s] v_s with f_t = 1/(sum_s A[t,s] + eps) (or scale):
        //   dv_s += f_t A[t,s] g_t
        //   dA[t,s] = f_t g_t . v_s  - (normalized) f_t g_t . o_t
        double g_dot_o = 0;
        if (p.normalize)
          for (int64_t e = 0; e < d.dv; ++e) {
            double o_te = 0;
            for (int64_t s = 0; s < n; ++s) o_te += a[t * n + s] * v.data[at(b, s, h, d.dv) + e];
            g_dot_o += g[e] * f[t] * o_te;
          }
        for (int64_t s = 0; s < n; ++s) {
          if (!visible(p, t, s)) continue;
          double g_dot_v = 0;
          for (int64_t e = 0; e < d.dv; ++e) {
            g_dot_v += g[e] * v.data[at(b, s, h, d.dv) + e];
            grad_v.data[at(b, s, h, d.dv) + e] += f[t] * a[t * n + s] * g[e];
          }
          const double da = f[t] * (g_dot_v - g_dot_o);
          // A[t,s] = W[bt,bs] phi(q_t) . phi(k_s):
          //   dW[bt,bs] += dA phi(q_t).phi(k_s), dphi(q_t) += dA W phi(k_s), dphi(k_s) += dA W
          //   phi(q_t)
          const int64_t bt = p.layout->block_of(t), bs = p.layout->block_of(s);
          const double wts = mixing(p, w.data, h, bt, bs);
          double dot = 0;
          for (int64_t r = 0; r < d.dk; ++r) {
            const double xq = q.data[at(b, t, h, d.dk) + r], xk = k.data[at(b, s, h, d.dk) + r];
            const double uq = feature(p.phi, xq), uk = feature(p.phi, xk);
            dot += uq * uk;
            grad_q.data[at(b, t, h, d.dk) + r] += da * wts * uk * feature_derivative(p.phi, xq);
            grad_k.data[at(b, s, h, d.dk) + r] += da * wts * uq * feature_derivative(p.phi, xk);
          }
          grad_w.data[mixing_index(p, h, bt, bs)] += da * dot;
        }
      }
    }
}

}  // namespace mhla::reference
