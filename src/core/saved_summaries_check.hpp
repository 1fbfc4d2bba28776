#pragma once
// Backward may be handed summaries that forward() saved for other inputs; it
// would then return wrong gradients without any sign. A fingerprint catches
// that: per block, the key sums z_b and the row sums of S_b (S_b times a ones
// vector, i.e. sum_j phi(k_j) sum_e v_j[e]) recomputed in double from k and v,
// O(C (Dk + Dv)) per block against the block's O(C Dk Dv) summary. Release
// builds check the first and last block of every (batch, head), which costs
// nothing measurable; debug builds check every block.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/feature_map.hpp"
#include "core/finite_results.hpp"
#include "core/validate.hpp"

namespace mhla::detail {

template <typename T>
void check_saved_summaries_match(const char* fn, const Problem& p, const T* k, const T* v,
                                 const T* saved) {
  const AttentionDims& d = p.dims;
  const int64_t m = p.blocks, x1 = d.dv + 1;
#ifdef NDEBUG
  const std::vector<int64_t> blocks =
      m > 1 ? std::vector<int64_t>{0, m - 1} : std::vector<int64_t>{0};
#else
  std::vector<int64_t> blocks(static_cast<size_t>(m));
  for (int64_t b = 0; b < m; ++b) blocks[b] = b;
#endif
  // A summation of n terms is off by at most about n * eps * sum|terms|.
  const double unit = 4 * double(std::numeric_limits<T>::epsilon());
  std::vector<double> z(d.dk), z_abs(d.dk), row(d.dk), row_abs(d.dk);
  for (int64_t batch = 0; batch < d.batch; ++batch)
    for (int64_t h = 0; h < d.heads; ++h)
      for (int64_t blk : blocks) {
        std::fill(z.begin(), z.end(), 0.0), std::fill(z_abs.begin(), z_abs.end(), 0.0);
        std::fill(row.begin(), row.end(), 0.0), std::fill(row_abs.begin(), row_abs.end(), 0.0);
        int64_t rows = 0;
        p.table.for_each_run(blk, [&](int64_t first, int64_t len) {
          for (int64_t t = first; t < first + len; ++t, ++rows) {
            const T* kt = k + ((batch * d.tokens + t) * d.heads + h) * d.dk;
            const T* vt = v + ((batch * d.tokens + t) * d.heads + h) * d.dv;
            double v_sum = 0, v_abs = 0;
            for (int64_t e = 0; e < d.dv; ++e)
              v_sum += double(vt[e]), v_abs += std::abs(double(vt[e]));
            for (int64_t a = 0; a < d.dk; ++a) {
              const double f = double(feature(p.phi, kt[a]));
              z[a] += f, z_abs[a] += std::abs(f);
              row[a] += f * v_sum, row_abs[a] += std::abs(f) * v_abs;
            }
          }
        });
        const T* s = saved + ((batch * d.heads + h) * m + blk) * d.dk * x1;
        for (int64_t a = 0; a < d.dk; ++a) {
          double saved_row = 0;
          for (int64_t e = 0; e < d.dv; ++e) saved_row += double(s[a * x1 + e]);
          const double saved_z = double(s[a * x1 + d.dv]);
          if (!std::isfinite(z[a]) || !std::isfinite(row[a]))
            continue;  // non-finite k or v propagate
          // Below T's smallest normal number the relative bound no longer holds
          // (subnormal products keep few digits): an absolute floor covers it.
          const double floor = double(rows + d.dv + 1) * double(std::numeric_limits<T>::min());
          const double z_tol = unit * double(rows + 1) * z_abs[a] + floor;
          const double row_tol = unit * double(rows + d.dv + 1) * row_abs[a] + floor;
          if (std::abs(saved_z - z[a]) <= z_tol && std::abs(saved_row - row[a]) <= row_tol)
            continue;
          fail(fn,
               "saved_summaries do not belong to these k and v: block " + std::to_string(blk) +
                   " of batch " + std::to_string(batch) + ", head " + std::to_string(h) +
                   " holds z[" + std::to_string(a) + "] = " + format_number(saved_z) +
                   " and sum_e S[" + std::to_string(a) + ", e] = " + format_number(saved_row) +
                   " but k and v give " + format_number(z[a]) + " and " + format_number(row[a]) +
                   "; pass the summaries that forward() saved for the same q, k, v and w, or none");
        }
      }
}

// W[i, b] as the mix reads it for the head behind `copy` (the mixing copy):
// zero where the masking leaves b out of row i's mix (causal: b >= i, whose
// diagonal acts inside the block instead; block-causal: b > i).
template <typename T>
double mix_weight(const Problem& p, const T* w, int64_t copy, int64_t i, int64_t b) {
  const int64_t row = p.first_block + i;
  if ((p.causal && b >= row) || (p.block_causal && b > row)) return 0;
  if (p.toeplitz)
    return double(w[copy * (p.toeplitz_length + 1) + std::min(row - b, p.toeplitz_length)]);
  return double(w[(copy * p.w_stride + row) * p.w_stride + b]);
}

// Saved mixed summaries depend on w as well as k and v: handed ones that
// forward() computed before w changed (an optimizer step between forward and
// backward), backward would return wrong gradients without any sign. The
// fingerprint is two entries of every block's mixed summary, recomputed in
// double from k, v and w: z~_i[0] = sum_b W[i,b] sum_{j in b} phi(k_j)[0] and
// S~_i[0,0] (the same with phi(k_j)[0] v_j[0]), O(N + M^2) per (batch, head)
// against the mix's O(M^2 Dk Dv).
template <typename T>
void check_saved_mixed_match(const char* fn, const Problem& p, const T* k, const T* v, const T* w,
                             const T* saved_mixed) {
  const AttentionDims& d = p.dims;
  const int64_t m = p.blocks, ms = p.mixing_blocks, heads = d.heads, x1 = d.dv + 1;
  const double unit = 4 * double(std::numeric_limits<T>::epsilon());
  // Per (head, key block): the two fingerprint sums and their absolute values,
  // gathered token by token (whole rows of k and v, heads innermost).
  std::vector<double> z(heads * ms), z_abs(heads * ms), s(heads * ms), s_abs(heads * ms);
  for (int64_t batch = 0; batch < d.batch; ++batch) {
    std::fill(z.begin(), z.end(), 0.0), std::fill(z_abs.begin(), z_abs.end(), 0.0);
    std::fill(s.begin(), s.end(), 0.0), std::fill(s_abs.begin(), s_abs.end(), 0.0);
    int64_t longest = 0;
    // Blocks write disjoint entries: a parallel loop reads k and v at memory speed.
#pragma omp parallel for schedule(static) reduction(max : longest)
    for (int64_t blk = 0; blk < ms; ++blk) {
      int64_t rows = 0;
      p.table.for_each_run(blk, [&](int64_t first, int64_t len) {
        for (int64_t t = first; t < first + len; ++t, ++rows)
          for (int64_t h = 0; h < heads; ++h) {
            const int64_t row = (batch * d.tokens + t) * heads + h, e = h * ms + blk;
            const double f = double(feature(p.phi, k[row * d.dk]));
            const double fv = f * double(v[row * d.dv]);
            z[e] += f, z_abs[e] += std::abs(f), s[e] += fv, s_abs[e] += std::abs(fv);
          }
      });
      longest = std::max(longest, rows);
    }
    // A float sum of (block rows + mixed blocks) terms per entry.
    const double terms = double(longest + ms + 1);
    const double floor = terms * double(std::numeric_limits<T>::min());
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < m; ++i) {
        double want_z = 0, want_s = 0, bound_z = 0, bound_s = 0;
        for (int64_t b = 0; b < ms; ++b) {
          const double wib = mix_weight(p, w, p.per_head_mixing ? h : 0, i, b);
          const int64_t e = h * ms + b;
          want_z += wib * z[e], bound_z += std::abs(wib) * z_abs[e];
          want_s += wib * s[e], bound_s += std::abs(wib) * s_abs[e];
        }
        if (!std::isfinite(bound_z) || !std::isfinite(bound_s))
          continue;  // non-finite inputs propagate
        const T* mixed_i = saved_mixed + ((batch * heads + h) * m + i) * d.dk * x1;
        const double got_z = double(mixed_i[d.dv]), got_s = double(mixed_i[0]);
        if (std::abs(got_z - want_z) <= unit * terms * bound_z + floor &&
            std::abs(got_s - want_s) <= unit * terms * bound_s + floor)
          continue;
        fail(fn, "saved_mixed does not belong to these k, v and w: block " + std::to_string(i) +
                     " of batch " + std::to_string(batch) + ", head " + std::to_string(h) +
                     " holds z~[0] = " + format_number(got_z) +
                     " and S~[0, 0] = " + format_number(got_s) + " but k, v and w give " +
                     format_number(want_z) + " and " + format_number(want_s) +
                     "; pass the mixed summaries that forward() saved for the same q, k, v and "
                     "w, or none");
      }
  }
}

}  // namespace mhla::detail
