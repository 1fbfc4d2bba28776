// The tiling of the bfloat16-state forward emulated on the CPU
// (bf16_state_emulation.hpp) against the float64 operator.
#include "cuda/bf16_state_cases.hpp"
#include "cuda/bf16_state_emulation.hpp"

namespace mhla::test {
namespace {

using namespace mhla::cuda::state;
using cuda::KernelProblem;

// The emulated forward against the float64 forward on the same inputs,
// given as tokens of `format`.
void check_forward(const Case& c, cuda::TokenFormat format) {
  const EmulatedCase e(c, 29, format);
  const KernelProblem& p = e.problem();
  ASSERT_TRUE(fits(p));

  const EmulatedForward got =
      ForwardEmulation(p, cast<float>(e.q), cast<float>(e.k), cast<float>(e.v), e.w).run();

  const Options& options = e.options;
  const TensorView<const double> qv = view(e.q, c.q_shape()), kv = view(e.k, c.q_shape()),
                                 vv = view(e.v, c.v_shape()), wv = view(e.w64, c.w_shape());
  const std::vector<int64_t> s_shape = saved_summaries_shape(options, c.q_shape(), c.v_shape());
  std::vector<double> o64(e.v.size()), s64(size_t(numel(s_shape))), m64(s64.size());
  auto state = ForwardState<double>::over(view(s64, s_shape), view(m64, s_shape));
  forward<double>(options, qv, kv, vv, wv, view(o64, c.v_shape()), state);
  // The float64 state as the kernels lay it out: [Dk, Dv] rows and [Dk] normalisers.
  const auto split = [&](const std::vector<double>& joined, std::vector<double>& rows,
                         std::vector<double>& last) {
    const int64_t dv = c.dv;
    for (size_t r = 0; r < joined.size() / size_t(dv + 1); ++r) {
      for (int64_t x = 0; x < dv; ++x) rows.push_back(joined[r * size_t(dv + 1) + size_t(x)]);
      last.push_back(joined[r * size_t(dv + 1) + size_t(dv)]);
    }
  };
  std::vector<double> s_rows, z, m_rows, mz;
  split(s64, s_rows, z);
  split(m64, m_rows, mz);
  // bfloat16 state rows and operands: each a rounding of 2^-9 from float64.
  EXPECT_CLOSE(got.s, s_rows, 1e-2, "summaries");
  // The normalisers are float sums; float16 keys enter them rounded to
  // bfloat16 as they are staged (2^-9 a term: 2.0e-3 at worst, emulated).
  const double z_tolerance = format == cuda::TokenFormat::float16 ? 3e-3 : 1e-5;
  EXPECT_CLOSE(got.z, z, z_tolerance, "normalisers");
  EXPECT_CLOSE(got.mixed, m_rows, 1e-2, "mixed summaries");
  EXPECT_CLOSE(got.mixed_z, mz, z_tolerance, "mixed normalisers");
  EXPECT_CLOSE(got.o, o64, 1e-2, "o");
}

class Bf16StateTiling : public testing::TestWithParam<Case> {};

TEST_P(Bf16StateTiling, MatchesFloat64OnTheSameInputs) {
  check_forward(GetParam(), cuda::TokenFormat::bfloat16);
}

INSTANTIATE_TEST_SUITE_P(AllModes, Bf16StateTiling, testing::ValuesIn(bf16_state_cases()),
                         case_name);

// float16 tokens, rounded to bfloat16 as they are staged and o written as float16.
class Float16StateTiling : public testing::TestWithParam<Case> {};

TEST_P(Float16StateTiling, MatchesFloat64OnTheSameInputs) {
  check_forward(GetParam(), cuda::TokenFormat::float16);
}

INSTANTIATE_TEST_SUITE_P(AllModes, Float16StateTiling, testing::ValuesIn(float16_state_cases()),
                         case_name);

// What the kernels refuse, so that the backend keeps the split-operand kernels for it.
TEST(Bf16StateTiling, RefusesWhatItsTilesCannotHold) {
  KernelProblem p;
  p.batch = 1, p.tokens = 64, p.heads = 2, p.dk = 64, p.dv = 64, p.blocks = 4, p.largest_block = 16;
  p.mixing_blocks = 4;
  EXPECT_TRUE(fits(p));
  for (auto change : std::vector<void (*)(KernelProblem&)>{
           [](KernelProblem& x) { x.dk = 60; },   // not a multiple of 8
           [](KernelProblem& x) { x.dv = 136; },  // over 128
           [](KernelProblem& x) { x.first_block = 1; },
           [](KernelProblem& x) { x.mixing_blocks = 8; },
       }) {
    KernelProblem changed = p;
    change(changed);
    EXPECT_FALSE(fits(changed));
  }
  KernelProblem causal = p;  // token-level causal masking is theirs too
  causal.causal = true;
  EXPECT_TRUE(fits(causal));
}

}  // namespace
}  // namespace mhla::test
