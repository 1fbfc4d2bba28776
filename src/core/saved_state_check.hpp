#pragma once
// backward() may be handed summaries or mixed summaries that forward() saved
// for other inputs (another k or v, or w before an optimizer step); it would
// then return wrong gradients without any sign. (It never reads o, so q and o
// cannot be stale: the gradients are those of the q it is given.) Each saved
// array is held to a fingerprint recomputed in double from k, v and w, in
// every block:
//   z_b = sum_j phi(k_j),  p_b = S_b r = sum_j phi(k_j) (v_j . r)
// per (batch, head, block b), Dk numbers each, with r a fixed vector of
// distinct positive entries, so that a change of any v element (a swap inside
// a row included) moves p_b; and
//   z~_i = sum_b W[i,b] z_b,  p~_i = sum_b W[i,b] p_b
// for every query block i. The saved summaries must hold z_b and S_b r, the
// mixed summaries z~_i and S~_i r. The cost is one pass over k and v
// (O(N (Dk + Dv))) and an [M, M] x [M, 2 Dk] product per (batch, head),
// against the backward's O(N Dk Dv + M^2 Dk Dv). Each comparison allows the
// worst-case rounding of the float sums behind the saved entries, so a change
// below that bound is not seen (nor does it move the gradients by more than
// the same order).
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/element.hpp"
#include "core/feature_map.hpp"
#include "core/finite_results.hpp"
#include "core/validate.hpp"
#include "mhla_support/blas.hpp"

namespace mhla::detail {

// r[e] = 1 + frac(e * golden ratio): distinct, in [1, 2), no pattern an
// ordinary change of v follows.
inline std::vector<double> fingerprint_probe(int64_t dv) {
  std::vector<double> r(static_cast<size_t>(dv));
  for (int64_t e = 0; e < dv; ++e) {
    const double x = double(e) * 0.6180339887498949;
    r[e] = 1.0 + (x - std::floor(x));
  }
  return r;
}

// Every block's fingerprint for one backward call, from k and v.
struct Fingerprints {
  int64_t dk = 0, blocks = 0;
  std::vector<double> probe;  // r, Dv long
  // [slice][block][2 Dk]: z_b then p_b; `magnitude` the sums of their terms'
  // magnitudes, which bound the float sums' rounding.
  std::vector<double> block, magnitude;

  int64_t at(int64_t slice, int64_t blk) const { return (slice * blocks + blk) * 2 * dk; }
};

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

template <typename S>
Fingerprints fingerprints(const Problem& p, const S* k, const S* v) {
  const AttentionDims& d = p;
  const int64_t heads = d.heads, m = p.blocks;
  Fingerprints f;
  f.dk = d.dk, f.blocks = m;
  f.probe = fingerprint_probe(d.dv);
  f.block.assign(size_t(d.batch * heads * m * 2 * d.dk), 0.0);
  f.magnitude.assign(f.block.size(), 0.0);
  const double* r = f.probe.data();
  // One task per (batch, block): it reads whole token rows (every head), so
  // k and v stream through at memory speed; tasks write disjoint entries.
#pragma omp parallel for schedule(dynamic)
  for (int64_t task = 0; task < d.batch * m; ++task) {
    const int64_t batch = task / m, blk = task % m;
    // phi of one key row in the tokens' own precision: a loop of its own,
    // which vectorises its exponential (sums in double alongside do not).
    using F = decltype(value_of(*k));
    std::vector<F> features(static_cast<size_t>(d.dk));
    dispatch_feature(p.phi, [&]<FeatureMap Phi>() {
      p.table.for_each_run(blk, [&](int64_t first, int64_t len) {
        for (int64_t t = first; t < first + len; ++t)
          for (int64_t h = 0; h < heads; ++h) {
            const int64_t row = (batch * d.tokens + t) * heads + h;
            const S* kt = k + row * d.dk;
            const S* vt = v + row * d.dv;
            double u = 0, u_abs = 0;
#pragma omp simd reduction(+ : u, u_abs)
            for (int64_t e = 0; e < d.dv; ++e) {
              const double x = double(value_of(vt[e]));
              u += x * r[e], u_abs += std::abs(x) * r[e];
            }
            double* fz = f.block.data() + f.at(batch * heads + h, blk);
            double* fa = f.magnitude.data() + f.at(batch * heads + h, blk);
            F* phi = features.data();
#pragma omp simd
            for (int64_t a = 0; a < d.dk; ++a) phi[a] = apply_feature<Phi>(value_of(kt[a]));
#pragma omp simd
            for (int64_t a = 0; a < d.dk; ++a) {
              const double x = double(phi[a]);
              fz[a] += x, fa[a] += std::abs(x);
              fz[d.dk + a] += x * u, fa[d.dk + a] += std::abs(x) * u_abs;
            }
          }
      });
    });
  }
  return f;
}

// Every query block's mix of the block fingerprints, for the mixed summaries'
// check: [slice][i][2 Dk] holds z~_i then p~_i. One [M, M] x [M, 2 Dk]
// product per slice, on the dense W each copy reads (masked entries zero).
struct MixedFingerprints {
  std::vector<double> mixed;
  // Per slice, [2 Dk]: the largest magnitude over blocks; per (copy, i): the
  // sum of |W[i, b]| over the blocks the mix reads. Their product bounds the
  // magnitude behind each mixed entry.
  std::vector<double> largest, row_weight;
};

template <typename T>
MixedFingerprints mixed_fingerprints(const Problem& p, const Fingerprints& f, const T* w) {
  const int64_t heads = p.heads, m = p.blocks, slices = p.batch * heads, x2 = 2 * f.dk;
  const int64_t copies = p.per_head_mixing ? heads : 1;
  MixedFingerprints mf;
  std::vector<double> dense(size_t(copies * m * m));
  mf.row_weight.assign(size_t(copies * m), 0.0);
  for (int64_t c = 0; c < copies; ++c)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t b = 0; b < m; ++b) {
        const double x = mix_weight(p, w, c, i, b);
        dense[(c * m + i) * m + b] = x;
        mf.row_weight[c * m + i] += std::abs(x);
      }
  mf.mixed.assign(f.block.size(), 0.0);
  mf.largest.assign(size_t(slices * x2), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t slice = 0; slice < slices; ++slice) {
    const int64_t copy = p.per_head_mixing ? slice % heads : 0;
    cpu::gemm(false, false, m, x2, m, 1.0, dense.data() + copy * m * m, m,
              f.block.data() + f.at(slice, 0), x2, 0.0, mf.mixed.data() + f.at(slice, 0), x2);
    double* top = mf.largest.data() + slice * x2;
    for (int64_t b = 0; b < m; ++b)
      for (int64_t a = 0; a < x2; ++a) top[a] = std::max(top[a], f.magnitude[f.at(slice, b) + a]);
  }
  return mf;
}

// One saved value against its fingerprint: within `tol`, or either side not
// finite (non-finite inputs propagate; the kernel reports them).
inline bool fingerprint_agrees(double saved, double want, double tol) {
  return !std::isfinite(saved + want + tol) || std::abs(saved - want) <= tol;
}

// The first disagreeing entry of a checked array (slice < 0: none).
struct FingerprintMismatch {
  int64_t slice = -1, index = 0, a = 0;  // index: a block, or for o a token
  double saved_z = 0, saved_p = 0, z = 0, p = 0;
};

// Over (slice or batch, item) pairs in parallel, the first in order for which
// `check` returns a mismatch.
template <typename Check>
FingerprintMismatch first_mismatch(int64_t outer, int64_t inner, Check&& check) {
  std::vector<FingerprintMismatch> found(size_t(outer * inner));
#pragma omp parallel for schedule(dynamic)
  for (int64_t item = 0; item < outer * inner; ++item)
    found[item] = check(item / inner, item % inner);
  for (const FingerprintMismatch& x : found)
    if (x.slice >= 0) return x;
  return {};
}

// One saved [Dk, Dv + 1] summary against its fingerprint `want` (z, then
// S r): entry a of each within `z_unit` and `p_unit` times its magnitude
// `bound[a]` and `bound[Dk + a]`, plus `floor`. The first entry that is not,
// as a mismatch of (slice, index), or none.
template <typename T>
FingerprintMismatch compare_summary(const T* s, const double* want, const double* bound,
                                    double z_unit, double p_unit, double floor, int64_t dk,
                                    int64_t dv, const double* r, int64_t slice, int64_t index) {
  for (int64_t a = 0; a < dk; ++a) {
    const T* row = s + a * (dv + 1);
    double p = 0;
    for (int64_t e = 0; e < dv; ++e) p += double(row[e]) * r[e];
    const double z = double(row[dv]);
    if (!fingerprint_agrees(z, want[a], z_unit * bound[a] + floor) ||
        !fingerprint_agrees(p, want[dk + a], p_unit * bound[dk + a] + floor))
      return FingerprintMismatch{slice, index, a, z, p, want[a], want[dk + a]};
  }
  return {};
}

// T's own unit of the bounds: 4 eps per term.
template <typename T>
constexpr double rounding_unit() {
  return 4 * double(std::numeric_limits<T>::epsilon());
}

// `rounding`: the relative error of each term beyond T's own, when the saved
// arrays came from products on rounded operands (bfloat16 products round
// phi(k) to 8 significant bits: 2^-8 each).
template <typename T>
void check_saved_summaries_match(const char* fn, const Problem& p, const Fingerprints& f,
                                 const T* saved, double rounding = 0) {
  const AttentionDims& d = p;
  // Below T's smallest normal number the relative bound no longer holds
  // (subnormal products keep few digits): an absolute floor covers it.
  const int64_t longest = p.table.max_block_size();
  const double floor = double(longest + d.dv + 1) * double(std::numeric_limits<T>::min());
  const double z_unit = rounding_unit<T>() * double(longest + 1) + rounding;
  const double p_unit = rounding_unit<T>() * double(longest + d.dv + 1) + rounding;
  const FingerprintMismatch x =
      first_mismatch(d.batch * d.heads, p.blocks, [&](int64_t slice, int64_t blk) {
        return compare_summary(saved + (slice * p.blocks + blk) * d.dk * (d.dv + 1),
                               f.block.data() + f.at(slice, blk),
                               f.magnitude.data() + f.at(slice, blk), z_unit, p_unit, floor, d.dk,
                               d.dv, f.probe.data(), slice, blk);
      });
  if (x.slice < 0) return;
  fail(fn, "saved_summaries do not belong to these k and v: block " + std::to_string(x.index) +
               " of batch " + std::to_string(x.slice / d.heads) + ", head " +
               std::to_string(x.slice % d.heads) + " holds z[" + std::to_string(x.a) +
               "] = " + format_number(x.saved_z) + " and (S r)[" + std::to_string(x.a) +
               "] = " + format_number(x.saved_p) + " but k and v give " + format_number(x.z) +
               " and " + format_number(x.p) +
               " (r: a fixed probe vector); pass the summaries that forward() saved for the "
               "same q, k, v and w, or none");
}

template <typename T>
void check_saved_mixed_match(const char* fn, const Problem& p, const Fingerprints& f, const T* w,
                             const T* saved_mixed, double rounding = 0) {
  const AttentionDims& d = p;
  const int64_t m = p.blocks;
  const MixedFingerprints mf = mixed_fingerprints(p, f, w);
  // Terms of a mixed entry's float sum: the block's rows, r's, then the mix's.
  const double terms = double(p.table.max_block_size() + d.dv + m + 1);
  const double floor = terms * double(std::numeric_limits<T>::min());
  const double unit = rounding_unit<T>() * terms + rounding;
  const FingerprintMismatch x = first_mismatch(d.batch * d.heads, m, [&](int64_t slice, int64_t i) {
    // The magnitude behind entry a: at most sum_b |W[i, b]| times the
    // largest block magnitude of a.
    const double weight = mf.row_weight[(p.per_head_mixing ? slice % d.heads : 0) * m + i];
    return compare_summary(saved_mixed + (slice * m + i) * d.dk * (d.dv + 1),
                           mf.mixed.data() + f.at(slice, i), mf.largest.data() + slice * 2 * d.dk,
                           unit * weight, unit * weight, floor, d.dk, d.dv, f.probe.data(), slice,
                           i);
  });
  if (x.slice < 0) return;
  fail(fn, "saved_mixed does not belong to these k, v and w: block " + std::to_string(x.index) +
               " of batch " + std::to_string(x.slice / d.heads) + ", head " +
               std::to_string(x.slice % d.heads) + " holds z~[" + std::to_string(x.a) +
               "] = " + format_number(x.saved_z) + " and (S~ r)[" + std::to_string(x.a) +
               "] = " + format_number(x.saved_p) + " but k, v and w give " + format_number(x.z) +
               " and " + format_number(x.p) +
               " (r: a fixed probe vector); pass the mixed summaries that forward() saved for "
               "the same q, k, v and w, or none");
}

}  // namespace mhla::detail
