#pragma once
// Backward may be handed summaries that forward() saved for other inputs; it
// would then return wrong gradients without any sign. A fingerprint catches
// that: per block, the key sums z_b and the row sums of S_b (S_b times a ones
// vector, i.e. sum_j phi(k_j) sum_e v_j[e]) recomputed in double from k and v,
// O(C (Dk + Dv)) per block against the block's O(C Dk Dv) summary. Release
// builds check the first and last block of every (batch, head) (0.2 ms of a
// 25 ms backward pass at N = 16384, H = 8); debug builds check every block.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/element.hpp"
#include "core/feature_map.hpp"
#include "core/finite_results.hpp"
#include "core/validate.hpp"

namespace mhla::detail {

// A checked block's first key feature whose fingerprint disagrees (a < 0: none).
struct SummaryMismatch {
  int64_t a = -1;
  double saved_z = 0, saved_row = 0, z = 0, row = 0;
};

template <FeatureMap Phi, typename S, typename T>
SummaryMismatch compare_summary(const Problem& p, const S* k, const S* v, const T* saved,
                                int64_t batch, int64_t h, int64_t blk, double rounding,
                                std::vector<double>& sums) {
  const AttentionDims& d = p.dims;
  const int64_t x1 = d.dv + 1;
  // z, |terms of z|, row sums, |terms of the row sums|, each Dk long.
  sums.assign(size_t(4 * d.dk), 0.0);
  double* z = sums.data();
  double* z_abs = z + d.dk;
  double* row = z_abs + d.dk;
  double* row_abs = row + d.dk;
  int64_t rows = 0;
  p.table.for_each_run(blk, [&](int64_t first, int64_t len) {
    for (int64_t t = first; t < first + len; ++t, ++rows) {
      const S* kt = k + ((batch * d.tokens + t) * d.heads + h) * d.dk;
      const S* vt = v + ((batch * d.tokens + t) * d.heads + h) * d.dv;
      double v_sum = 0, v_abs = 0;
#pragma omp simd reduction(+ : v_sum, v_abs)
      for (int64_t e = 0; e < d.dv; ++e) {
        const double x = double(value_of(vt[e]));
        v_sum += x, v_abs += std::abs(x);
      }
#pragma omp simd
      for (int64_t a = 0; a < d.dk; ++a) {
        const double f = double(apply_feature<Phi>(value_of(kt[a])));
        z[a] += f, z_abs[a] += std::abs(f);
        row[a] += f * v_sum, row_abs[a] += std::abs(f) * v_abs;
      }
    }
  });
  // A summation of n terms is off by at most about n * eps * sum|terms|.
  const double unit = 4 * double(std::numeric_limits<T>::epsilon());
  // Below T's smallest normal number the relative bound no longer holds
  // (subnormal products keep few digits): an absolute floor covers it.
  const double floor = double(rows + d.dv + 1) * double(std::numeric_limits<T>::min());
  const T* s = saved + ((batch * d.heads + h) * p.blocks + blk) * d.dk * x1;
  for (int64_t a = 0; a < d.dk; ++a) {
    if (!std::isfinite(z[a]) || !std::isfinite(row[a])) continue;  // non-finite k or v propagate
    double saved_row = 0;
    for (int64_t e = 0; e < d.dv; ++e) saved_row += double(s[a * x1 + e]);
    const double saved_z = double(s[a * x1 + d.dv]);
    const double z_tol = (unit * double(rows + 1) + rounding) * z_abs[a] + floor;
    const double row_tol = (unit * double(rows + d.dv + 1) + rounding) * row_abs[a] + floor;
    if (std::abs(saved_z - z[a]) > z_tol || std::abs(saved_row - row[a]) > row_tol)
      return {a, saved_z, saved_row, z[a], row[a]};
  }
  return {};
}

// `rounding`: the relative error of each term beyond float's own, when the
// summaries came from products on rounded operands (bfloat16 products round
// phi(k) to 8 significant bits: 2^-8 each).
template <typename S, typename T>
void check_saved_summaries_match(const char* fn, const Problem& p, const S* k, const S* v,
                                 const T* saved, double rounding = 0) {
  const AttentionDims& d = p.dims;
  const int64_t m = p.blocks;
#ifdef NDEBUG
  const std::vector<int64_t> blocks =
      m > 1 ? std::vector<int64_t>{0, m - 1} : std::vector<int64_t>{0};
#else
  std::vector<int64_t> blocks(static_cast<size_t>(m));
  for (int64_t b = 0; b < m; ++b) blocks[b] = b;
#endif
  // One task per checked (batch, head, block), run in parallel: their rows
  // are H * D elements apart, and one thread reading them one after another
  // waited on memory (1.1 ms at N = 16384, H = 8, 4% of the backward pass).
  const int64_t per_slice = int64_t(blocks.size()), tasks = d.batch * d.heads * per_slice;
  std::vector<SummaryMismatch> found(static_cast<size_t>(tasks));
#pragma omp parallel
  {
    std::vector<double> sums;
#pragma omp for schedule(static)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t blk = blocks[task % per_slice], slice = task / per_slice;
      found[task] = dispatch_feature(p.phi, [&]<FeatureMap Phi>() {
        return compare_summary<Phi>(p, k, v, saved, slice / d.heads, slice % d.heads, blk, rounding,
                                    sums);
      });
    }
  }
  // The first mismatch in (batch, head, block) order, whatever the threads.
  for (int64_t task = 0; task < tasks; ++task) {
    const SummaryMismatch& x = found[task];
    if (x.a < 0) continue;
    const int64_t slice = task / per_slice;
    fail(fn, "saved_summaries do not belong to these k and v: block " +
                 std::to_string(blocks[task % per_slice]) + " of batch " +
                 std::to_string(slice / d.heads) + ", head " + std::to_string(slice % d.heads) +
                 " holds z[" + std::to_string(x.a) + "] = " + format_number(x.saved_z) +
                 " and sum_e S[" + std::to_string(x.a) + ", e] = " + format_number(x.saved_row) +
                 " but k and v give " + format_number(x.z) + " and " + format_number(x.row) +
                 "; pass the summaries that forward() saved for the same q, k, v and w, or none");
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
// fingerprint is two entries of every block's mixed summary recomputed in
// double, z~_i[0] = sum_b W[i,b] z_b[0] and S~_i[0,0] = sum_b W[i,b] S_b[0,0],
// O(M^2) per (batch, head) against the mix's O(M^2 Dk Dv). The block entries
// z_b[0] = sum_{j in b} phi(k_j)[0] and S_b[0,0] (the same with
// phi(k_j)[0] v_j[0]) come from the saved summaries when backward has them
// (check_saved_summaries_match holds them to k and v), else from k and v:
// one pass over N H rows, which took 1.4 ms (5% of the backward pass) at
// N = 16384, H = 8.
// `rounding` as above, for the block entries.
template <typename S, typename T>
void check_saved_mixed_match(const char* fn, const Problem& p, const S* k, const S* v, const T* w,
                             const T* saved_mixed, const T* saved_summaries = nullptr,
                             double rounding = 0) {
  const AttentionDims& d = p.dims;
  const int64_t m = p.blocks, ms = p.mixing_blocks, heads = d.heads, x1 = d.dv + 1;
  const double unit = 4 * double(std::numeric_limits<T>::epsilon());
  // The saved summaries hold the blocks the mix read only when the call mixes
  // its own blocks (no earlier piece's state).
  const bool from_summaries = saved_summaries != nullptr && ms == m;
  // Per (head, key block): the two block entries and the absolute sums that
  // bound their rounding.
  std::vector<double> z(heads * ms), z_abs(heads * ms), s(heads * ms), s_abs(heads * ms);
  for (int64_t batch = 0; batch < d.batch; ++batch) {
    // The terms of each mixed entry's float sum: the mix's, plus the block
    // sums' when they are recomputed here from the tokens.
    double terms = double(ms + 1);
    if (from_summaries) {
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t blk = 0; blk < ms; ++blk) {
          const T* sb = saved_summaries + ((batch * heads + h) * ms + blk) * d.dk * x1;
          const int64_t e = h * ms + blk;
          z[e] = double(sb[d.dv]), s[e] = double(sb[0]);
          z_abs[e] = std::abs(z[e]), s_abs[e] = std::abs(s[e]);
        }
    } else {
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
              const double f = double(feature(p.phi, value_of(k[row * d.dk])));
              const double fv = f * double(value_of(v[row * d.dv]));
              z[e] += f, z_abs[e] += std::abs(f), s[e] += fv, s_abs[e] += std::abs(fv);
            }
        });
        longest = std::max(longest, rows);
      }
      terms += double(longest);
    }
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
        if (std::abs(got_z - want_z) <= (unit * terms + rounding) * bound_z + floor &&
            std::abs(got_s - want_s) <= (unit * terms + rounding) * bound_s + floor)
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
