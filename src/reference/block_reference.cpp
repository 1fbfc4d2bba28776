// Block-summary reference: the spec's equations, token by token, in double.
//
// Every token t of query block i reads one summary pair
//   Sr_t = sum_b W[i,b] S_b          (non-causal: all b; causal: b < i; block-causal: b <= i)
//        + W[i,i] sum_{j in i, j<=t} phi(k_j) v_j^T        (causal only)
//   zr_t = the same with phi(k_j) in place of phi(k_j) v_j^T,
// and outputs o_t = phi(q_t)^T Sr_t / (phi(q_t) . zr_t + eps)  (normalized)
//           or  o_t = scale * phi(q_t)^T Sr_t                  (unnormalized).
// Rebuilding Sr_t for every token costs O(N (M + C) Dk Dv): fine for tests,
// and it keeps each line a restatement of the definition.
#include <vector>

#include "core/feature_map.hpp"
#include "core/validate.hpp"
#include "mhla/reference.hpp"
#include "reference/indexing.hpp"

namespace mhla::reference {
namespace {

using detail::feature;
using detail::feature_derivative;
using detail::Problem;

// One (batch, head) slice of the inputs with phi already applied.
struct Head {
  int64_t n, dk, dv;
  std::vector<double> u;    // phi(q)  [N, Dk]
  std::vector<double> kap;  // phi(k)  [N, Dk]
  std::vector<double> val;  // v       [N, Dv]
};

Head load_head(const Problem& p, const double* q, const double* k, const double* v, int64_t b,
               int64_t h) {
  const auto& d = p;
  const Indexer at{d.tokens, d.heads};
  Head head{d.tokens,
            d.dk,
            d.dv,
            std::vector<double>(d.tokens * d.dk),
            std::vector<double>(d.tokens * d.dk),
            std::vector<double>(d.tokens * d.dv)};
  for (int64_t t = 0; t < d.tokens; ++t) {
    for (int64_t i = 0; i < d.dk; ++i) {
      head.u[t * d.dk + i] = feature(p.phi, q[at(b, t, h, d.dk) + i]);
      head.kap[t * d.dk + i] = feature(p.phi, k[at(b, t, h, d.dk) + i]);
    }
    for (int64_t j = 0; j < d.dv; ++j) head.val[t * d.dv + j] = v[at(b, t, h, d.dv) + j];
  }
  return head;
}

// S_b = sum_{j in b} phi(k_j) v_j^T  [M, Dk, Dv];  z_b = sum_{j in b} phi(k_j)  [M, Dk]
struct Summaries {
  std::vector<double> s, z;
};

Summaries block_summaries(const Problem& p, const Head& x) {
  Summaries sum{std::vector<double>(p.blocks * x.dk * x.dv, 0.0),
                std::vector<double>(p.blocks * x.dk, 0.0)};
  for (int64_t j = 0; j < x.n; ++j) {
    const int64_t b = p.layout->block_of(j);
    for (int64_t i = 0; i < x.dk; ++i) {
      sum.z[b * x.dk + i] += x.kap[j * x.dk + i];
      for (int64_t e = 0; e < x.dv; ++e)
        sum.s[(b * x.dk + i) * x.dv + e] += x.kap[j * x.dk + i] * x.val[j * x.dv + e];
    }
  }
  return sum;
}

// Key blocks b whose full summary S_b query block i reads through W[i,b].
bool reads_full_block(const Problem& p, int64_t i, int64_t b) {
  if (p.causal) return b < i;
  if (p.block_causal) return b <= i;
  return true;
}

// Sr_t, zr_t as defined at the top of the file.
void read_summary(const Problem& p, const double* w, int64_t h, const Head& x, const Summaries& sum,
                  int64_t t, std::vector<double>& sr, std::vector<double>& zr) {
  std::fill(sr.begin(), sr.end(), 0.0);
  std::fill(zr.begin(), zr.end(), 0.0);
  const int64_t i = p.layout->block_of(t);
  for (int64_t b = 0; b < p.blocks; ++b) {
    if (!reads_full_block(p, i, b)) continue;
    const double wib = mixing(p, w, h, i, b);
    for (int64_t a = 0; a < x.dk * x.dv; ++a) sr[a] += wib * sum.s[b * x.dk * x.dv + a];
    for (int64_t a = 0; a < x.dk; ++a) zr[a] += wib * sum.z[b * x.dk + a];
  }
  if (!p.causal) return;
  const double wii = mixing(p, w, h, i, i);
  for (int64_t j = 0; j <= t; ++j) {
    if (p.layout->block_of(j) != i) continue;
    for (int64_t a = 0; a < x.dk; ++a) {
      zr[a] += wii * x.kap[j * x.dk + a];
      for (int64_t e = 0; e < x.dv; ++e)
        sr[a * x.dv + e] += wii * x.kap[j * x.dk + a] * x.val[j * x.dv + e];
    }
  }
}

}  // namespace

void block_forward(const Options& options, TensorView<const double> q, TensorView<const double> k,
                   TensorView<const double> v, TensorView<const double> w, TensorView<double> o) {
  const char* fn = "mhla::reference::block_forward";
  const Problem p = detail::validate_mhla(fn, options, q, k, v, w);
  detail::check_output(fn, "o", o, detail::v_shape(p));
  const auto& d = p;
  const Indexer at{d.tokens, d.heads};
  std::vector<double> sr(d.dk * d.dv), zr(d.dk);
  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      const Head x = load_head(p, q.data, k.data, v.data, b, h);
      const Summaries sum = block_summaries(p, x);
      for (int64_t t = 0; t < d.tokens; ++t) {
        read_summary(p, w.data, h, x, sum, t, sr, zr);
        double den = p.eps;  // den_t = phi(q_t) . zr_t + eps
        for (int64_t a = 0; a < d.dk; ++a) den += x.u[t * d.dk + a] * zr[a];
        for (int64_t e = 0; e < d.dv; ++e) {
          double num = 0;  // num_t = phi(q_t)^T Sr_t
          for (int64_t a = 0; a < d.dk; ++a) num += x.u[t * d.dk + a] * sr[a * d.dv + e];
          o.data[at(b, t, h, d.dv) + e] = p.normalize ? num / den : p.scale * num;
        }
      }
    }
}

void block_backward(const Options& options, TensorView<const double> q, TensorView<const double> k,
                    TensorView<const double> v, TensorView<const double> w,
                    TensorView<const double> grad_o, TensorView<double> grad_q,
                    TensorView<double> grad_k, TensorView<double> grad_v,
                    TensorView<double> grad_w) {
  const char* fn = "mhla::reference::block_backward";
  const Problem p = detail::validate_mhla(fn, options, q, k, v, w);
  const auto& d = p;
  detail::check_gradients(fn, d, grad_o, grad_q, grad_k, grad_v);
  detail::check_output(fn, "grad_w", grad_w, w.shape);
  const Indexer at{d.tokens, d.heads};
  const int64_t dk = d.dk, dv = d.dv;
  std::fill(grad_w.data, grad_w.data + detail::checked_product(grad_w.shape, "grad_w"), 0.0);
  std::vector<double> sr(dk * dv), zr(dk), a(dv), dsr(dk * dv), dzr(dk);

  for (int64_t b = 0; b < d.batch; ++b)
    for (int64_t h = 0; h < d.heads; ++h) {
      const Head x = load_head(p, q.data, k.data, v.data, b, h);
      const Summaries sum = block_summaries(p, x);
      Summaries dsum{std::vector<double>(sum.s.size(), 0.0),
                     std::vector<double>(sum.z.size(), 0.0)};
      std::vector<double> du(d.tokens * dk, 0.0), dkap(d.tokens * dk, 0.0),
          dval(d.tokens * dv, 0.0);

      for (int64_t t = 0; t < d.tokens; ++t) {
        const int64_t i = p.layout->block_of(t);
        const double* u = &x.u[t * dk];
        const double* g = &grad_o.data[at(b, t, h, dv)];
        read_summary(p, w.data, h, x, sum, t, sr, zr);
        // Forward again: den_t and o_t.
        double den = p.eps;
        for (int64_t r = 0; r < dk; ++r) den += u[r] * zr[r];
        double g_dot_o = 0;
        for (int64_t e = 0; e < dv; ++e) {
          double num = 0;
          for (int64_t r = 0; r < dk; ++r) num += u[r] * sr[r * dv + e];
          g_dot_o += g[e] * num / den;
        }
        // o = num / den:  dnum = g / den,  dden = -(g . o) / den.   o = scale num: dnum = scale g.
        for (int64_t e = 0; e < dv; ++e) a[e] = p.normalize ? g[e] / den : p.scale * g[e];
        const double c = p.normalize ? -g_dot_o / den : 0.0;
        // num = u^T Sr, den = u . zr + eps:  du = Sr dnum + zr dden,  dSr = u dnum^T,  dzr = u
        // dden.
        for (int64_t r = 0; r < dk; ++r) {
          double acc = zr[r] * c;
          for (int64_t e = 0; e < dv; ++e) acc += sr[r * dv + e] * a[e];
          du[t * dk + r] += acc;
          dzr[r] = u[r] * c;
          for (int64_t e = 0; e < dv; ++e) dsr[r * dv + e] = u[r] * a[e];
        }
        // Sr = sum_b W[i,b] S_b:  dW[i,b] += <dSr, S_b> + <dzr, z_b>,  dS_b += W[i,b] dSr.
        for (int64_t bb = 0; bb < p.blocks; ++bb) {
          if (!reads_full_block(p, i, bb)) continue;
          const double wib = mixing(p, w.data, h, i, bb);
          double dw = 0;
          for (int64_t r = 0; r < dk * dv; ++r) {
            dw += dsr[r] * sum.s[bb * dk * dv + r];
            dsum.s[bb * dk * dv + r] += wib * dsr[r];
          }
          for (int64_t r = 0; r < dk; ++r) {
            dw += dzr[r] * sum.z[bb * dk + r];
            dsum.z[bb * dk + r] += wib * dzr[r];
          }
          grad_w.data[mixing_index(p, h, i, bb)] += dw;
        }
        if (!p.causal) continue;
        // Causal: Sr += W[i,i] sum_{j in i, j<=t} phi(k_j) v_j^T, zr += W[i,i] sum phi(k_j).
        const double wii = mixing(p, w.data, h, i, i);
        double dw = 0;
        for (int64_t j = 0; j <= t; ++j) {
          if (p.layout->block_of(j) != i) continue;
          for (int64_t r = 0; r < dk; ++r) {
            double dkap_r = dzr[r];  // from zr
            for (int64_t e = 0; e < dv; ++e) {
              dw += dsr[r * dv + e] * x.kap[j * dk + r] * x.val[j * dv + e];
              dkap_r += dsr[r * dv + e] * x.val[j * dv + e];
              dval[j * dv + e] += wii * dsr[r * dv + e] * x.kap[j * dk + r];
            }
            dw += dzr[r] * x.kap[j * dk + r];
            dkap[j * dk + r] += wii * dkap_r;
          }
        }
        grad_w.data[mixing_index(p, h, i, i)] += dw;
      }
      // S_b = sum_{j in b} phi(k_j) v_j^T, z_b = sum phi(k_j):
      //   dphi(k_j) += dS_b v_j + dz_b,  dv_j += dS_b^T phi(k_j).
      for (int64_t j = 0; j < d.tokens; ++j) {
        const int64_t bb = p.layout->block_of(j);
        for (int64_t r = 0; r < dk; ++r) {
          double acc = dsum.z[bb * dk + r];
          for (int64_t e = 0; e < dv; ++e) {
            acc += dsum.s[(bb * dk + r) * dv + e] * x.val[j * dv + e];
            dval[j * dv + e] += dsum.s[(bb * dk + r) * dv + e] * x.kap[j * dk + r];
          }
          dkap[j * dk + r] += acc;
        }
      }
      // Through phi: dq = phi'(q) du, dk = phi'(k) dphi(k).
      for (int64_t t = 0; t < d.tokens; ++t) {
        for (int64_t r = 0; r < dk; ++r) {
          grad_q.data[at(b, t, h, dk) + r] =
              feature_derivative(p.phi, q.data[at(b, t, h, dk) + r]) * du[t * dk + r];
          grad_k.data[at(b, t, h, dk) + r] =
              feature_derivative(p.phi, k.data[at(b, t, h, dk) + r]) * dkap[t * dk + r];
        }
        for (int64_t e = 0; e < dv; ++e) grad_v.data[at(b, t, h, dv) + e] = dval[t * dv + e];
      }
    }
}

}  // namespace mhla::reference
