#pragma once
// Backward may be handed summaries that forward() saved for other inputs; it
// would then return wrong gradients without any sign. A fingerprint catches
// that: per block, the key sums z_b and the row sums of S_b (S_b times a ones
// vector, i.e. sum_j phi(k_j) sum_e v_j[e]) recomputed in double from k and v,
// O(C (Dk + Dv)) per block against the block's O(C Dk Dv) summary. Release
// builds check the first and last block of every (batch, head), which costs
// nothing measurable; debug builds check every block.
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

}  // namespace mhla::detail
