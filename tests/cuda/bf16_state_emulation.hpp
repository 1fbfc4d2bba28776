#pragma once
// The tiling of the bfloat16-state kernels (src/cuda/bf16_state_plan.hpp)
// emulated on the CPU, CTA by CTA and thread by thread: each thread stages
// the segments the plan gives it from the plan's sources into shared tiles
// that start as NaN (an entry no copy writes shows in the results, an entry
// written twice fails at once), each warp multiplies its 16 x 16 steps of
// bfloat16 operands in float (phi applied and rounded to bfloat16 in the
// operand, as in registers), and each lane writes its segment of a fragment
// where the plan says, rounded as the kernels round. The tests hold the
// results to the float64 operator on the same bfloat16 inputs
// (test_bf16_state_tiling.cpp, test_bf16_state_backward_tiling.cpp); they run
// in every build, the kernels themselves need a GPU (test_cuda_backend.cpp).
#include <cmath>
#include <limits>
#include <utility>

#include "core/validate.hpp"
#include "core/validated_call.hpp"
#include "cuda/bf16_state_plan.hpp"
#include "cuda/bf16_state_cases.hpp"
#include "cuda/kernel_problem_of.hpp"

namespace mhla::test {

using namespace mhla::cuda::state;
using cuda::KernelProblem;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

inline float round_bf16(float x) { return to_float(to_bfloat16(x)); }

// A result token as the kernels write it, rounded to the problem's format.
inline float round_token(const KernelProblem& p, float x) {
  return p.token_format == cuda::TokenFormat::float16 ? to_float(to_float16(x)) : round_bf16(x);
}

// phi as an operand fragment holds it: rounded to bfloat16 (identity untouched).
inline float operand_feature(FeatureMap phi, float x) {
  return phi == FeatureMap::identity ? x : round_bf16(cuda::feature(phi, x));
}

// A shared-memory tile of one stage, NaN until a copy writes an entry.
class SharedTile {
 public:
  SharedTile(int rows, int columns) : columns_(columns), x_(size_t(rows) * size_t(columns), kNaN) {}
  float at(int r, int c) const { return x_[size_t(r) * size_t(columns_) + size_t(c)]; }
  // One 16-byte copy: source[offset ..] or zeros where offset is -1.
  void copy(const Segment& s, const std::vector<float>& source, int64_t offset) {
    for (int u = 0; u < kSegment; ++u) set(s.row, s.column + u, offset >= 0 ? source[size_t(offset + u)] : 0.0f);
  }
  // One 16-byte copy of a token tensor: float16 tokens are rounded to
  // bfloat16 as the kernels stage them (bfloat16 tokens stay as they are).
  void copy_tokens(const Segment& s, const std::vector<float>& source, int64_t offset) {
    for (int u = 0; u < kSegment; ++u)
      set(s.row, s.column + u, offset >= 0 ? round_bf16(source[size_t(offset + u)]) : 0.0f);
  }
  void set(int r, int c, float value) {
    float& e = x_[size_t(r) * size_t(columns_) + size_t(c)];
    ASSERT_TRUE(std::isnan(e)) << "shared entry (" << r << ", " << c << ") written twice";
    e = value;
  }
  // A kernel rewriting a staged entry in place (the backward's dY).
  void replace(int r, int c, float value) {
    float& e = x_[size_t(r) * size_t(columns_) + size_t(c)];
    ASSERT_FALSE(std::isnan(e)) << "shared entry (" << r << ", " << c << ") rewritten before a copy";
    e = value;
  }

 private:
  int columns_;
  std::vector<float> x_;
};

// The kernels' staging loop: thread t of `threads` copies segments t, t + threads, ...
template <int kSegments, class Copy>
void for_each_staged(int threads, int rows, const Copy& copy) {
  for (int t = 0; t < threads; ++t)
    for (int g = t; g < rows * kSegments; g += threads) copy(segment_of<kSegments>(g));
}

// The kernels' stage_block_rows: tokens [c0, c0 + rows) of block `block` of
// slice `slice` of the token tensor `source` (`width` entries a row), rows
// past the block and entries past the width zeros.
template <int kSegments>
void stage_block_rows(const KernelProblem& p, SharedTile& tile, int threads, int rows, int64_t block,
                      const Slice& slice, int c0, const std::vector<float>& source, int64_t width) {
  for_each_staged<kSegments>(threads, rows, [&](const Segment& sg) {
    tile.copy_tokens(sg, source,
                     row_segment(block_token_row(p, slice, block, c0 + sg.row), sg.column, width));
  });
}

// phi in place on rows [0, rows) of a staged tile, entries [0, Dk) (the
// kernels' map_features).
inline void map_features(const KernelProblem& p, SharedTile& tile, int rows) {
  if (p.phi == FeatureMap::identity) return;
  for (int r = 0; r < rows; ++r)
    for (int d = 0; d < p.dk; ++d) tile.replace(r, d, round_bf16(cuda::feature(p.phi, tile.at(r, d))));
}

// A result array written once per entry, NaN until then.
struct Written {
  std::vector<float> x;
  explicit Written(int64_t n) : x(size_t(n), kNaN) {}
  void set(int64_t i, float value) {
    ASSERT_TRUE(std::isnan(x[size_t(i)])) << "result " << i << " written twice";
    x[size_t(i)] = value;
  }
};

// One warp's lanes writing the fragment at acc[row0 ..][col0 ..] (16 x 16):
// write(row within the fragment, column within it, 8 values).
template <class Write>
void write_fragment(const std::vector<std::vector<float>>& acc, int row0, int col0, const Write& write) {
  for (int lane = 0; lane < 32; ++lane) {
    const Segment s = lane_segment(lane);
    float x[kSegment];
    for (int u = 0; u < kSegment; ++u) x[u] = acc[size_t(row0 + s.row)][size_t(col0 + s.column + u)];
    write(s, x);
  }
}

// One CTA of the mix (bf16_state_mix.cu): rows [r0, r0 + kMixRows) and
// entries [f0, f0 + kMixColumns) of slice bh, to = W from or W^T from.
inline void emulate_mix(const KernelProblem& p, const std::vector<float>& w, bool transposed,
                        int64_t r0, int64_t f0, int64_t bh, const std::vector<float>& from,
                        Written& to) {
  constexpr int kWeightSegments = kInnerChunk / kSegment, kStateSegments = kMixColumns / kSegment;
  const int threads = kMixWarps * 32;
  const int64_t width = p.dk * p.dv, begin = mix_inner_begin(p, r0, transposed),
                end = mix_inner_end(p, r0, transposed);
  const int64_t head = slice_of(p, unsigned(bh)).head, slice = state_offset(p, bh, 0);
  std::vector<std::vector<float>> acc(kMixRows, std::vector<float>(kMixColumns));
  for (int64_t x0 = begin; x0 < end; x0 += kInnerChunk) {
    SharedTile wt(kMixRows, kInnerChunk + kPad), st(kInnerChunk, kMixColumns + kPad);
    for_each_staged<kWeightSegments>(threads, kMixRows, [&](const Segment& sg) {
      for (int u = 0; u < kSegment; ++u)
        wt.set(sg.row, sg.column + u,
               round_bf16(mix_entry(p, w.data(), head, r0 + sg.row, x0 + sg.column + u, end, transposed)));
    });
    for_each_staged<kStateSegments>(threads, kInnerChunk, [&](const Segment& sg) {
      const int64_t x = x0 + sg.row;
      const int64_t offset = row_segment(x < end ? x : -1, f0 + sg.column, width);
      st.copy(sg, from, offset >= 0 ? slice + offset : -1);
    });
    for (int r = 0; r < kMixRows; ++r)
      for (int f = 0; f < kMixColumns; ++f)
        for (int x = 0; x < kInnerChunk; ++x) acc[size_t(r)][size_t(f)] += wt.at(r, x) * st.at(x, f);
  }
  for (int warp = 0; warp < kMixWarps; ++warp)
    for (int n = 0; n < kMixColumns / kFrag; ++n)
      write_fragment(acc, warp * kFrag, n * kFrag, [&](const Segment& ls, const float (&x)[kSegment]) {
        const int64_t r = r0 + warp * kFrag + ls.row, f = f0 + n * kFrag + ls.column;
        if (r < p.blocks && f < width)
          for (int u = 0; u < kSegment; ++u) to.set(state_offset(p, bh, r) + f + u, round_bf16(x[u]));
      });
}

// One CTA of the normalisers' mix: row r of slice bh, to_z = W from_z or W^T from_z.
inline void emulate_mix_normalisers(const KernelProblem& p, const std::vector<float>& w,
                                    bool transposed, int64_t r, int64_t bh,
                                    const std::vector<float>& from_z, Written& to_z) {
  const int64_t head = slice_of(p, unsigned(bh)).head, end = mix_inner_end(p, r, transposed);
  for (int64_t d = 0; d < p.dk; ++d) {
    float sum = 0;
    for (int64_t x = mix_inner_begin(p, r, transposed); x < end; ++x) {
      const int64_t i = transposed ? x : r, b = transposed ? r : x;
      if (cuda::reads(p, i, b))
        sum += cuda::weight(p, w.data(), head, i, b) * from_z[size_t(normaliser_offset(p, bh, x) + d)];
    }
    to_z.set(normaliser_offset(p, bh, r) + d, sum);
  }
}

// The whole mix, as bf16_state_mix launches it.
inline void emulate_mixes(const KernelProblem& p, const std::vector<float>& w, bool transposed,
                          const std::vector<float>& from, const std::vector<float>& from_z,
                          Written& to, Written& to_z) {
  for (int64_t bh = 0; bh < p.batch * p.heads; ++bh) {
    for (int64_t r0 = 0; r0 < p.blocks; r0 += kMixRows)
      for (int64_t f0 = 0; f0 < p.dk * p.dv; f0 += kMixColumns)
        emulate_mix(p, w, transposed, r0, f0, bh, from, to);
    for (int64_t r = 0; r < p.blocks; ++r) emulate_mix_normalisers(p, w, transposed, r, bh, from_z, to_z);
  }
}

struct EmulatedForward {
  std::vector<float> s, z, mixed, mixed_z, o;
};

class ForwardEmulation {
 public:
  ForwardEmulation(const KernelProblem& p, const std::vector<float>& q, const std::vector<float>& k,
            const std::vector<float>& v, const std::vector<float>& w)
      : p_(p), q_(q), k_(k), v_(v), w_(w) {}

  EmulatedForward run() {
    const StateSizes sizes = state_sizes(p_);
    Written s(sizes.summaries), z(sizes.normalisers), mixed(sizes.summaries),
        mixed_z(sizes.normalisers), o(p_.batch * p_.tokens * p_.heads * p_.dv);
    const bool wide = column_fragments(p_.dv) == 8;
    for (int64_t bh = 0; bh < p_.batch * p_.heads; ++bh)
      for (int64_t b = 0; b < p_.blocks; ++b)
        wide ? summaries<8>(b, bh, s, z) : summaries<4>(b, bh, s, z);
    emulate_mixes(p_, w_, false, s.x, z.x, mixed, mixed_z);
    for (int64_t bh = 0; bh < p_.batch * p_.heads; ++bh)
      for (int64_t b = 0; b < p_.blocks; ++b)
        for (int64_t c0 = 0; c0 < read_chunks(p_) * kReadTokens; c0 += kReadTokens)
          wide ? outputs<8>(b, c0, bh, mixed.x, mixed_z.x, o) : outputs<4>(b, c0, bh, mixed.x, mixed_z.x, o);
    return {s.x, z.x, mixed.x, mixed_z.x, o.x};
  }

 private:
  int64_t count(int64_t block) const { return p_.block_start[block + 1] - p_.block_start[block]; }

  template <int kColumnFragments>
  void summaries(int64_t block, int64_t bh, Written& s, Written& z) const {
    constexpr int kKeySegments = kMaxDim / kSegment;
    constexpr int kValueSegments = kColumnFragments * kFrag / kSegment;
    const int warps = summaries_warps(p_.dk), threads = 32 * warps;
    const Slice slice = slice_of(p_, unsigned(bh));
    const int n = int(count(block));
    std::vector<std::vector<float>> acc(size_t(warps * kFrag), std::vector<float>(kColumnFragments * kFrag));
    std::vector<float> normaliser(size_t(p_.dk));
    for (int c0 = 0; c0 < n; c0 += kKeyChunk) {
      SharedTile kt(kKeyChunk, kMaxDim + kPad), vt(kKeyChunk, kColumnFragments * kFrag + kPad);
      stage_block_rows<kKeySegments>(p_, kt, threads, kKeyChunk, block, slice, c0, k_, p_.dk);
      stage_block_rows<kValueSegments>(p_, vt, threads, kKeyChunk, block, slice, c0, v_, p_.dv);
      const int valid = std::min(kKeyChunk, n - c0);
      for (int d = 0; d < p_.dk; ++d)
        for (int j = 0; j < valid; ++j) normaliser[size_t(d)] += cuda::feature(p_.phi, kt.at(j, d));
      for (int step = 0; step < kKeyChunk && step < valid; step += kFrag)
        for (int d = 0; d < warps * kFrag; ++d)
          for (int e = 0; e < kColumnFragments * kFrag; ++e)
            for (int j = step; j < step + kFrag; ++j)
              acc[size_t(d)][size_t(e)] += operand_feature(p_.phi, kt.at(j, d)) * vt.at(j, e);
    }
    const int64_t base = state_offset(p_, bh, block);
    for (int warp = 0; warp < warps; ++warp)
      for (int f = 0; f < kColumnFragments; ++f)
        write_fragment(acc, warp * kFrag, f * kFrag, [&](const Segment& ls, const float (&x)[kSegment]) {
          const int64_t d = warp * kFrag + ls.row, e = f * kFrag + ls.column;
          if (d < p_.dk && e < p_.dv)
            for (int u = 0; u < kSegment; ++u) s.set(base + d * p_.dv + e + u, round_bf16(x[u]));
        });
    for (int d = 0; d < p_.dk; ++d) z.set(normaliser_offset(p_, bh, block) + d, normaliser[size_t(d)]);
  }

  template <int kColumnFragments>
  void outputs(int64_t block, int64_t c0, int64_t bh, const std::vector<float>& mixed,
               const std::vector<float>& mixed_z, Written& o) const {
    constexpr int kQuerySegments = kInnerChunk / kSegment;
    constexpr int kStateSegments = kColumnFragments * kFrag / kSegment;
    const int threads = kReadWarps * 32;
    if (c0 >= count(block)) return;
    const Slice slice = slice_of(p_, unsigned(bh));
    std::vector<int64_t> rows(kReadTokens);
    for (int t = 0; t < kReadTokens; ++t) rows[size_t(t)] = block_token_row(p_, slice, block, c0 + t);
    const int64_t state = state_offset(p_, bh, block), z = normaliser_offset(p_, bh, block);
    std::vector<std::vector<float>> acc(kReadTokens, std::vector<float>(kColumnFragments * kFrag));
    std::vector<float> den(kReadTokens);
    for (int a0 = 0; a0 < p_.dk; a0 += kInnerChunk) {
      SharedTile qt(kReadTokens, kInnerChunk + kPad), st(kInnerChunk, kColumnFragments * kFrag + kPad);
      for_each_staged<kQuerySegments>(threads, kReadTokens, [&](const Segment& sg) {
        qt.copy_tokens(sg, q_, row_segment(rows[size_t(sg.row)], a0 + sg.column, p_.dk));
      });
      for_each_staged<kStateSegments>(threads, kInnerChunk, [&](const Segment& sg) {
        const int64_t a = a0 + sg.row;
        const int64_t offset = row_segment(a < p_.dk ? a : -1, sg.column, p_.dv);
        st.copy(sg, mixed, offset >= 0 ? state + offset : -1);
      });
      const int valid = std::min<int>(kInnerChunk, int(p_.dk) - a0);
      for (int t = 0; t < kReadTokens; ++t)
        for (int a = 0; a < valid; ++a)
          den[size_t(t)] += cuda::feature(p_.phi, qt.at(t, a)) * mixed_z[size_t(z + a0 + a)];
      for (int step = 0; step < kInnerChunk && step < valid; step += kFrag)
        for (int t = 0; t < kReadTokens; ++t)
          for (int e = 0; e < kColumnFragments * kFrag; ++e)
            for (int a = step; a < step + kFrag; ++a)
              acc[size_t(t)][size_t(e)] += operand_feature(p_.phi, qt.at(t, a)) * st.at(a, e);
    }
    if (p_.causal) own_block<kColumnFragments>(block, int(c0), slice, acc, den);
    for (int warp = 0; warp < kReadWarps; ++warp)
      for (int n = 0; n < kColumnFragments; ++n)
        write_fragment(acc, warp * kFrag, n * kFrag, [&](const Segment& ls, const float (&y)[kSegment]) {
          const int t = warp * kFrag + ls.row;
          const int64_t e = n * kFrag + ls.column;
          if (rows[size_t(t)] < 0 || e >= p_.dv) return;
          const float inverse = 1.0f / (den[size_t(t)] + float(p_.eps));
          for (int u = 0; u < kSegment; ++u)
            o.set(rows[size_t(t)] * p_.dv + e + u,
                  round_token(p_, p_.normalize ? y[u] * inverse : float(p_.scale) * y[u]));
        });
  }

  // Token-level causal: the CTA's tokens [c0, c0 + kReadTokens) against
  // their block's own keys j <= t, kKeyChunk keys a step: each warp's scores
  // masked, scaled by W[i, i] and rounded into its tile, then against V; each
  // lane's part of its row's denominator, the even lane's first.
  template <int kColumnFragments>
  void own_block(int64_t block, int c0, const Slice& slice, std::vector<std::vector<float>>& acc,
                 std::vector<float>& den) const {
    constexpr int kKeySegments = kMaxDim / kSegment, kValueSegments = kColumnFragments * kFrag / kSegment;
    const int threads = kReadWarps * 32;
    const float w_ii = cuda::weight(p_, w_.data(), slice.head, block, block);
    SharedTile qt(kReadTokens, kMaxDim + kPad);
    stage_block_rows<kKeySegments>(p_, qt, threads, kReadTokens, block, slice, c0, q_, p_.dk);
    map_features(p_, qt, kReadTokens);
    std::vector<float> parts(2 * kReadTokens);  // [token][lane of the pair]
    for (int j0 = 0; j0 < own_keys_end(c0, int(count(block))); j0 += kKeyChunk) {
      SharedTile kt(kKeyChunk, kMaxDim + kPad), vt(kKeyChunk, kColumnFragments * kFrag + kPad);
      stage_block_rows<kKeySegments>(p_, kt, threads, kKeyChunk, block, slice, j0, k_, p_.dk);
      stage_block_rows<kValueSegments>(p_, vt, threads, kKeyChunk, block, slice, j0, v_, p_.dv);
      map_features(p_, kt, kKeyChunk);
      for (int warp = 0; warp < kReadWarps; ++warp) {
        std::vector<std::vector<float>> scores(kFrag, std::vector<float>(kKeyChunk));
        for (int step = 0; step < p_.dk; step += kFrag)
          for (int r = 0; r < kFrag; ++r)
            for (int j = 0; j < kKeyChunk; ++j)
              for (int d = step; d < step + kFrag; ++d)
                scores[size_t(r)][size_t(j)] += qt.at(warp * kFrag + r, d) * kt.at(j, d);
        SharedTile st(kFrag, kKeyChunk + kPad);
        for (int f = 0; f < kKeyChunk / kFrag; ++f)
          write_fragment(scores, 0, f * kFrag, [&](const Segment& ls, const float (&x)[kSegment]) {
            const int t = c0 + warp * kFrag + ls.row, j = j0 + f * kFrag + ls.column;
            for (int u = 0; u < kSegment; ++u) {
              const float y = j + u <= t ? w_ii * x[u] : 0.0f;
              parts[size_t(2 * (warp * kFrag + ls.row) + ls.column / kSegment)] += y;
              st.set(ls.row, f * kFrag + ls.column + u, round_bf16(y));
            }
          });
        for (int r = 0; r < kFrag; ++r)
          for (int e = 0; e < kColumnFragments * kFrag; ++e)
            for (int j = 0; j < kKeyChunk; ++j)
              acc[size_t(warp * kFrag + r)][size_t(e)] += st.at(r, j) * vt.at(j, e);
      }
    }
    for (int t = 0; t < kReadTokens; ++t) den[size_t(t)] += parts[size_t(2 * t)] + parts[size_t(2 * t + 1)];
  }

  const KernelProblem& p_;
  const std::vector<float>&q_, &k_, &v_, &w_;
};

// A case as the emulations take it: its inputs rounded to its token format,
// bfloat16 or float16 (held as doubles, exactly), W in float, and the kernels' view of its
// validated problem (which points into the block arrays held here).
class EmulatedCase {
 public:
  EmulatedCase(const Case& c, uint64_t seed, cuda::TokenFormat format = cuda::TokenFormat::bfloat16)
      : EmulatedCase(c, make_inputs(c, seed), format) {}

  std::vector<double> q, k, v, grad_o, w64;
  std::vector<float> w;
  Options options;

 private:
  EmulatedCase(const Case& c, const Inputs& in, cuda::TokenFormat format)
      : q(rounded(in.q, format)),
        k(rounded(in.k, format)),
        v(rounded(in.v, format)),
        grad_o(rounded(in.grad_o, format)),
        w64(widened_floats(in.w)),
        w(in.w.begin(), in.w.end()),
        options(c.options()),
        call_(detail::validate_mhla("emulation", options, view(std::as_const(q), c.q_shape()),
                                    view(std::as_const(k), c.q_shape()),
                                    view(std::as_const(v), c.v_shape()),
                                    view(std::as_const(w64), c.w_shape())),
              options.layout),
        arrays_(cuda::block_arrays(call_.problem().table, c.tokens())),
        problem_(
            cuda::kernel_problem(call_.problem(), arrays_.values.data(), arrays_.largest_block)) {
    problem_.token_format = format;
  }
  static std::vector<double> rounded(const std::vector<double>& x, cuda::TokenFormat format) {
    return format == cuda::TokenFormat::float16 ? float16_values(rounded_to_float16(x))
                                                : bfloat16_values(rounded_to_bfloat16(x));
  }
  // W as the kernels read it: float.
  static std::vector<double> widened_floats(const std::vector<double>& x) {
    const std::vector<float> f(x.begin(), x.end());
    return std::vector<double>(f.begin(), f.end());
  }

  detail::ValidatedCall call_;
  cuda::BlockArrays arrays_;
  KernelProblem problem_;

 public:
  const KernelProblem& problem() const { return problem_; }
};

}  // namespace mhla::test
