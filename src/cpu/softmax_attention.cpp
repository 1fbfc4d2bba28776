// The softmax baseline's kernel: softmax attention in tiles with an online softmax (the
// FlashAttention algorithm on CPU): a query tile streams over key tiles keeping a running row max
// m, row sum l and unnormalised accumulator; memory is O(tile^2 + N D). q, k and v are read in
// place: a head's rows are strided by H * D, which the GEMMs take as their leading dimension.
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/softmax_kernel.hpp"
#include "mhla_support/blas.hpp"
#include "mhla_support/vector_math.hpp"

namespace mhla::cpu {
namespace {

// 64 query rows x 256 keys: a 64 KiB fp32 score tile that stays in L2 while
// both GEMMs and the exponentials touch it.
constexpr int64_t kQueryTile = 64;
constexpr int64_t kKeyTile = 256;

// Keys [s0, s1) a query tile [t0, t1) can see.
int64_t key_end(const SoftmaxProblem& x, int64_t t1) { return x.causal ? t1 : x.d.tokens; }

// s[r, c] = logit of query t0+r and key s0+c, -inf where masked.
template <typename T>
void scores(const SoftmaxProblem& x, const T* q, const T* k, int64_t base_q, int64_t base_k,
            int64_t t0, int64_t rows, int64_t s0, int64_t cols, T* s) {
  const int64_t ld = x.d.heads * x.d.dk;
  gemm(false, true, rows, cols, x.d.dk, T(x.scale), q + base_q + t0 * ld, ld, k + base_k + s0 * ld,
       ld, T(0), s, cols);
  if (x.causal && s0 + cols - 1 > t0)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = std::max<int64_t>(0, t0 + r + 1 - s0); c < cols; ++c)
        s[r * cols + c] = -std::numeric_limits<T>::infinity();
}

// p[c] = exp(s[c] - shift). Kept in its own loop so it runs on vector
// exponentials (mhla_support/vector_math.hpp): the softmax costs N^2 of them.
template <typename T>
void exponentiate(const T* s, T shift, int64_t n, T* p) {
#pragma omp simd
  for (int64_t c = 0; c < n; ++c) p[c] = detail::vector_exp(s[c] - shift);
}

}  // namespace

template <typename T>
void softmax_forward(const SoftmaxProblem& x, const T* q, const T* k, const T* v, T* o, T* lse) {
  const auto& d = x.d;
  const int64_t tiles = (d.tokens + kQueryTile - 1) / kQueryTile;
  const int64_t ldv = d.heads * d.dv;
#pragma omp parallel
  {
    std::vector<T> s(kQueryTile * kKeyTile), acc(kQueryTile * d.dv), row_max(kQueryTile),
        row_sum(kQueryTile);
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < d.batch * d.heads * tiles; ++task) {
      const int64_t bh = task / tiles, b = bh / d.heads, h = bh % d.heads;
      const int64_t t0 = (task % tiles) * kQueryTile, rows = std::min(kQueryTile, d.tokens - t0);
      const int64_t base_q = (b * d.tokens * d.heads + h) * d.dk;
      const int64_t base_v = (b * d.tokens * d.heads + h) * d.dv;
      std::fill(acc.begin(), acc.end(), T(0));
      std::fill(row_max.begin(), row_max.end(), -std::numeric_limits<T>::infinity());
      std::fill(row_sum.begin(), row_sum.end(), T(0));
      for (int64_t s0 = 0; s0 < key_end(x, t0 + rows); s0 += kKeyTile) {
        const int64_t cols = std::min(kKeyTile, key_end(x, t0 + rows) - s0);
        scores(x, q, k, base_q, base_q, t0, rows, s0, cols, s.data());
        for (int64_t r = 0; r < rows; ++r) {
          T* sr = s.data() + r * cols;
          T tile_max = row_max[r];
          for (int64_t c = 0; c < cols; ++c) tile_max = std::max(tile_max, sr[c]);
          if (tile_max == -std::numeric_limits<T>::infinity()) {  // row fully masked so far
            std::fill(sr, sr + cols, T(0));
            continue;
          }
          // Rescale what was accumulated under the old max.
          const T correction = std::exp(row_max[r] - tile_max);
          row_max[r] = tile_max;
          exponentiate(sr, tile_max, cols, sr);
          T sum = 0;
          for (int64_t c = 0; c < cols; ++c) sum += sr[c];
          row_sum[r] = row_sum[r] * correction + sum;
          for (int64_t e = 0; e < d.dv; ++e) acc[r * d.dv + e] *= correction;
        }
        // acc += P V_tile
        gemm(false, false, rows, d.dv, cols, T(1), s.data(), cols, v + base_v + s0 * ldv, ldv, T(1),
             acc.data(), d.dv);
      }
      for (int64_t r = 0; r < rows; ++r) {
        T* out = o + base_v + (t0 + r) * ldv;
        for (int64_t e = 0; e < d.dv; ++e) out[e] = acc[r * d.dv + e] / row_sum[r];
        lse[bh * d.tokens + t0 + r] = row_max[r] + std::log(row_sum[r]);
      }
    }
  }
}

template <typename T>
void softmax_backward(const SoftmaxProblem& x, const T* q, const T* k, const T* v, const T* o,
                      const T* lse, const T* grad_o, T* grad_q, T* grad_k, T* grad_v) {
  const auto& d = x.d;
  const int64_t ldk = d.heads * d.dk, ldv = d.heads * d.dv, slices = d.batch * d.heads;

  // delta_t = grad_o_t . o_t, the softmax Jacobian's row term.
  std::vector<T> delta(slices * d.tokens);
#pragma omp parallel for schedule(static)
  for (int64_t bh = 0; bh < slices; ++bh) {
    const int64_t base_v = ((bh / d.heads) * d.tokens * d.heads + bh % d.heads) * d.dv;
    for (int64_t t = 0; t < d.tokens; ++t) {
      T acc = 0;
      for (int64_t e = 0; e < d.dv; ++e)
        acc += grad_o[base_v + t * ldv + e] * o[base_v + t * ldv + e];
      delta[bh * d.tokens + t] = acc;
    }
  }

  // dlogits of one (query tile, key tile) pair: P = exp(s - lse), dP = dO V^T,
  // dS = P (dP - delta) * scale.  Leaves P in p and dS in ds.
  auto tile_gradients = [&](int64_t bh, int64_t t0, int64_t rows, int64_t s0, int64_t cols, T* p,
                            T* ds) {
    const int64_t base_q = ((bh / d.heads) * d.tokens * d.heads + bh % d.heads) * d.dk;
    const int64_t base_v = ((bh / d.heads) * d.tokens * d.heads + bh % d.heads) * d.dv;
    scores(x, q, k, base_q, base_q, t0, rows, s0, cols, p);
    for (int64_t r = 0; r < rows; ++r)
      exponentiate(p + r * cols, lse[bh * d.tokens + t0 + r], cols, p + r * cols);
    gemm(false, true, rows, cols, d.dv, T(1), grad_o + base_v + t0 * ldv, ldv,
         v + base_v + s0 * ldv, ldv, T(0), ds, cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        ds[r * cols + c] =
            p[r * cols + c] * (ds[r * cols + c] - delta[bh * d.tokens + t0 + r]) * T(x.scale);
  };

  const int64_t q_tiles = (d.tokens + kQueryTile - 1) / kQueryTile;
  const int64_t k_tiles = (d.tokens + kKeyTile - 1) / kKeyTile;
  // Two passes, each output owned by one task: dq per query tile, then dk and
  // dv per key tile. Recomputing P twice buys a deterministic, lock-free result.
#pragma omp parallel
  {
    std::vector<T> p(kQueryTile * kKeyTile), ds(kQueryTile * kKeyTile), dq(kQueryTile * d.dk);
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < slices * q_tiles; ++task) {
      const int64_t bh = task / q_tiles;
      const int64_t t0 = (task % q_tiles) * kQueryTile, rows = std::min(kQueryTile, d.tokens - t0);
      const int64_t base_q = ((bh / d.heads) * d.tokens * d.heads + bh % d.heads) * d.dk;
      std::fill(dq.begin(), dq.end(), T(0));
      for (int64_t s0 = 0; s0 < key_end(x, t0 + rows); s0 += kKeyTile) {
        const int64_t cols = std::min(kKeyTile, key_end(x, t0 + rows) - s0);
        tile_gradients(bh, t0, rows, s0, cols, p.data(), ds.data());
        gemm(false, false, rows, d.dk, cols, T(1), ds.data(), cols, k + base_q + s0 * ldk, ldk,
             T(1), dq.data(), d.dk);
      }
      for (int64_t r = 0; r < rows; ++r)
        std::copy(dq.begin() + r * d.dk, dq.begin() + (r + 1) * d.dk,
                  grad_q + base_q + (t0 + r) * ldk);
    }
  }
#pragma omp parallel
  {
    std::vector<T> p(kQueryTile * kKeyTile), ds(kQueryTile * kKeyTile);
    std::vector<T> dk(kKeyTile * d.dk), dv(kKeyTile * d.dv);
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < slices * k_tiles; ++task) {
      const int64_t bh = task / k_tiles;
      const int64_t s0 = (task % k_tiles) * kKeyTile, cols = std::min(kKeyTile, d.tokens - s0);
      const int64_t base_q = ((bh / d.heads) * d.tokens * d.heads + bh % d.heads) * d.dk;
      const int64_t base_v = ((bh / d.heads) * d.tokens * d.heads + bh % d.heads) * d.dv;
      std::fill(dk.begin(), dk.end(), T(0));
      std::fill(dv.begin(), dv.end(), T(0));
      // Causal: only query tiles ending after s0 see this key tile.
      const int64_t first_tile = x.causal ? s0 / kQueryTile : 0;
      for (int64_t t0 = first_tile * kQueryTile; t0 < d.tokens; t0 += kQueryTile) {
        const int64_t rows = std::min(kQueryTile, d.tokens - t0);
        tile_gradients(bh, t0, rows, s0, cols, p.data(), ds.data());
        gemm(true, false, cols, d.dv, rows, T(1), p.data(), cols, grad_o + base_v + t0 * ldv, ldv,
             T(1), dv.data(), d.dv);
        gemm(true, false, cols, d.dk, rows, T(1), ds.data(), cols, q + base_q + t0 * ldk, ldk, T(1),
             dk.data(), d.dk);
      }
      for (int64_t c = 0; c < cols; ++c) {
        std::copy(dk.begin() + c * d.dk, dk.begin() + (c + 1) * d.dk,
                  grad_k + base_q + (s0 + c) * ldk);
        std::copy(dv.begin() + c * d.dv, dv.begin() + (c + 1) * d.dv,
                  grad_v + base_v + (s0 + c) * ldv);
      }
    }
  }
}

template void softmax_forward<float>(const SoftmaxProblem&, const float*, const float*,
                                     const float*, float*, float*);
template void softmax_forward<double>(const SoftmaxProblem&, const double*, const double*,
                                      const double*, double*, double*);
template void softmax_backward<float>(const SoftmaxProblem&, const float*, const float*,
                                      const float*, const float*, const float*, const float*,
                                      float*, float*, float*);
template void softmax_backward<double>(const SoftmaxProblem&, const double*, const double*,
                                       const double*, const double*, const double*, const double*,
                                       double*, double*, double*);

}  // namespace mhla::cpu
