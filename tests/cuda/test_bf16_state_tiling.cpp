// The tiling of the bfloat16-state forward (src/cuda/bf16_state_plan.hpp)
// emulated on the CPU, CTA by CTA and thread by thread: each thread stages
// the segments the plan gives it from the plan's sources into shared tiles
// that start as NaN (an entry no copy writes shows in the results, an entry
// written twice fails at once), each warp multiplies its 16 x 16 steps of
// bfloat16 operands in float (phi applied and rounded to bfloat16 in the
// operand, as in registers), and each lane writes its segment of a fragment
// where the plan says, rounded as the kernels round. The results are held to
// the float64 operator on the same bfloat16 inputs. It runs in every build:
// the kernels themselves need a GPU (tests/cuda/test_cuda_backend.cpp).
#include <cmath>
#include <limits>

#include "core/validate.hpp"
#include "core/validated_call.hpp"
#include "cuda/bf16_state_plan.hpp"
#include "cuda/bf16_state_cases.hpp"
#include "cuda/kernel_problem_of.hpp"

namespace mhla::test {
namespace {

using namespace mhla::cuda::state;
using cuda::KernelProblem;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float round_bf16(float x) { return to_float(to_bfloat16(x)); }

// phi as an operand fragment holds it: rounded to bfloat16 (identity untouched).
float operand_feature(FeatureMap phi, float x) {
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
  void set(int r, int c, float value) {
    float& e = x_[size_t(r) * size_t(columns_) + size_t(c)];
    ASSERT_TRUE(std::isnan(e)) << "shared entry (" << r << ", " << c << ") written twice";
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

struct EmulatedForward {
  std::vector<float> s, z, mixed, mixed_z, o;
};

class Emulation {
 public:
  Emulation(const KernelProblem& p, const std::vector<float>& q, const std::vector<float>& k,
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
    for (int64_t bh = 0; bh < p_.batch * p_.heads; ++bh) {
      for (int64_t r0 = 0; r0 < p_.blocks; r0 += kMixRows)
        for (int64_t f0 = 0; f0 < p_.dk * p_.dv; f0 += kMixColumns) mix(r0, f0, bh, s.x, mixed);
      for (int64_t i = 0; i < p_.blocks; ++i) mix_normalisers(i, bh, z.x, mixed_z);
    }
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
      for_each_staged<kKeySegments>(threads, kKeyChunk, [&](const Segment& sg) {
        kt.copy(sg, k_, row_segment(block_token_row(p_, slice, block, c0 + sg.row), sg.column, p_.dk));
      });
      for_each_staged<kValueSegments>(threads, kKeyChunk, [&](const Segment& sg) {
        vt.copy(sg, v_, row_segment(block_token_row(p_, slice, block, c0 + sg.row), sg.column, p_.dv));
      });
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

  void mix(int64_t r0, int64_t f0, int64_t bh, const std::vector<float>& s, Written& mixed) const {
    constexpr int kWeightSegments = kInnerChunk / kSegment, kStateSegments = kMixColumns / kSegment;
    const int threads = kMixWarps * 32;
    const int64_t width = p_.dk * p_.dv, end = mix_inner_end(p_, r0);
    const int64_t head = slice_of(p_, unsigned(bh)).head, slice = state_offset(p_, bh, 0);
    std::vector<std::vector<float>> acc(kMixRows, std::vector<float>(kMixColumns));
    for (int64_t b0 = 0; b0 < end; b0 += kInnerChunk) {
      SharedTile wt(kMixRows, kInnerChunk + kPad), st(kInnerChunk, kMixColumns + kPad);
      for_each_staged<kWeightSegments>(threads, kMixRows, [&](const Segment& sg) {
        for (int u = 0; u < kSegment; ++u)
          wt.set(sg.row, sg.column + u,
                 round_bf16(mix_entry(p_, w_.data(), head, r0 + sg.row, b0 + sg.column + u, end)));
      });
      for_each_staged<kStateSegments>(threads, kInnerChunk, [&](const Segment& sg) {
        const int64_t b = b0 + sg.row;
        const int64_t offset = row_segment(b < end ? b : -1, f0 + sg.column, width);
        st.copy(sg, s, offset >= 0 ? slice + offset : -1);
      });
      for (int i = 0; i < kMixRows; ++i)
        for (int f = 0; f < kMixColumns; ++f)
          for (int x = 0; x < kInnerChunk; ++x) acc[size_t(i)][size_t(f)] += wt.at(i, x) * st.at(x, f);
    }
    for (int warp = 0; warp < kMixWarps; ++warp)
      for (int n = 0; n < kMixColumns / kFrag; ++n)
        write_fragment(acc, warp * kFrag, n * kFrag, [&](const Segment& ls, const float (&x)[kSegment]) {
          const int64_t i = r0 + warp * kFrag + ls.row, f = f0 + n * kFrag + ls.column;
          if (i < p_.blocks && f < width)
            for (int u = 0; u < kSegment; ++u) mixed.set(state_offset(p_, bh, i) + f + u, round_bf16(x[u]));
        });
  }

  void mix_normalisers(int64_t i, int64_t bh, const std::vector<float>& z, Written& mixed_z) const {
    const int64_t head = slice_of(p_, unsigned(bh)).head, end = mix_inner_end(p_, i);
    for (int64_t d = 0; d < p_.dk; ++d) {
      float sum = 0;
      for (int64_t b = 0; b < end; ++b)
        if (cuda::reads(p_, i, b))
          sum += cuda::weight(p_, w_.data(), head, i, b) * z[size_t(normaliser_offset(p_, bh, b) + d)];
      mixed_z.set(normaliser_offset(p_, bh, i) + d, sum);
    }
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
        qt.copy(sg, q_, row_segment(rows[size_t(sg.row)], a0 + sg.column, p_.dk));
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
    for (int warp = 0; warp < kReadWarps; ++warp)
      for (int n = 0; n < kColumnFragments; ++n)
        write_fragment(acc, warp * kFrag, n * kFrag, [&](const Segment& ls, const float (&y)[kSegment]) {
          const int t = warp * kFrag + ls.row;
          const int64_t e = n * kFrag + ls.column;
          if (rows[size_t(t)] < 0 || e >= p_.dv) return;
          const float inverse = 1.0f / (den[size_t(t)] + float(p_.eps));
          for (int u = 0; u < kSegment; ++u)
            o.set(rows[size_t(t)] * p_.dv + e + u,
                  round_bf16(p_.normalize ? y[u] * inverse : float(p_.scale) * y[u]));
        });
  }

  const KernelProblem& p_;
  const std::vector<float>&q_, &k_, &v_, &w_;
};

class Bf16StateTiling : public testing::TestWithParam<Case> {};

TEST_P(Bf16StateTiling, MatchesFloat64OnTheSameInputs) {
  const Case& c = GetParam();
  const Inputs in = make_inputs(c, 29);
  const std::vector<double> q = bfloat16_values(rounded_to_bfloat16(in.q)),
                            k = bfloat16_values(rounded_to_bfloat16(in.k)),
                            v = bfloat16_values(rounded_to_bfloat16(in.v));
  const std::vector<float> w(in.w.begin(), in.w.end());
  const std::vector<double> w64(w.begin(), w.end());
  const Options options = c.options();
  const TensorView<const double> qv = view(q, c.q_shape()), kv = view(k, c.q_shape()),
                                 vv = view(v, c.v_shape()), wv = view(w64, c.w_shape());
  const detail::ValidatedCall call(detail::validate_mhla("emulation", options, qv, kv, vv, wv),
                                   options.layout);
  const cuda::BlockArrays arrays = cuda::block_arrays(call.problem().table, c.tokens());
  const KernelProblem p =
      cuda::kernel_problem(call.problem(), arrays.values.data(), arrays.largest_block);
  if (c.masking == Masking::causal) {
    EXPECT_FALSE(fits(p)) << "token-level causal masking stays on the split-operand kernels";
    return;
  }
  ASSERT_TRUE(fits(p));

  const EmulatedForward got =
      Emulation(p, cast<float>(q), cast<float>(k), cast<float>(v), w).run();

  const std::vector<int64_t> s_shape = saved_summaries_shape(options, c.q_shape(), c.v_shape());
  std::vector<double> o64(v.size()), s64(size_t(numel(s_shape))), m64(s64.size());
  forward<double>(options, qv, kv, vv, wv, view(o64, c.v_shape()), view(s64, s_shape),
                  view(m64, s_shape));
  // The float64 state as the kernels lay it out: [Dk, Dv] rows and [Dk] normalisers.
  const auto split = [&](const std::vector<double>& joined, std::vector<double>& rows,
                         std::vector<double>& last) {
    const int64_t dv = c.dv;
    for (size_t r = 0; r < joined.size() / size_t(dv + 1); ++r) {
      for (int64_t e = 0; e < dv; ++e) rows.push_back(joined[r * size_t(dv + 1) + size_t(e)]);
      last.push_back(joined[r * size_t(dv + 1) + size_t(dv)]);
    }
  };
  std::vector<double> s_rows, z, m_rows, mz;
  split(s64, s_rows, z);
  split(m64, m_rows, mz);
  // bfloat16 state rows and operands: each a rounding of 2^-9 from float64.
  EXPECT_CLOSE(got.s, s_rows, 1e-2, "summaries");
  EXPECT_CLOSE(got.z, z, 1e-5, "normalisers");
  EXPECT_CLOSE(got.mixed, m_rows, 1e-2, "mixed summaries");
  EXPECT_CLOSE(got.mixed_z, mz, 1e-5, "mixed normalisers");
  EXPECT_CLOSE(got.o, o64, 1e-2, "o");
}

INSTANTIATE_TEST_SUITE_P(AllModes, Bf16StateTiling, testing::ValuesIn(bf16_state_cases()), case_name);

// What the kernels refuse, so that the backend keeps the split-operand kernels for it.
TEST(Bf16StateTiling, RefusesWhatItsTilesCannotHold) {
  KernelProblem p;
  p.batch = 1, p.tokens = 64, p.heads = 2, p.dk = 64, p.dv = 64, p.blocks = 4, p.largest_block = 16;
  p.mixing_blocks = 4;
  EXPECT_TRUE(fits(p));
  for (auto change : std::vector<void (*)(KernelProblem&)>{
           [](KernelProblem& x) { x.dk = 60; },   // not a multiple of 8
           [](KernelProblem& x) { x.dv = 136; },  // over 128
           [](KernelProblem& x) { x.causal = true; },
           [](KernelProblem& x) { x.first_block = 1; },
           [](KernelProblem& x) { x.mixing_blocks = 8; },
       }) {
    KernelProblem changed = p;
    change(changed);
    EXPECT_FALSE(fits(changed));
  }
}

}  // namespace
}  // namespace mhla::test
