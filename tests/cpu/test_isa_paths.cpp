// The whole float operator on every instruction set this CPU runs: forward
// and every gradient against the fp64 operator on the catalogue of modes and
// awkward shapes, bit-identical across thread counts on each instruction set,
// and the instruction sets within rounding of each other.
#include <gtest/gtest.h>

#include "cpu/simd/isa.hpp"
#include "test_support.hpp"

namespace mhla::test {
namespace {

class IsaPaths : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override { cpu::simd::pin_target(GetParam()); }
  void TearDown() override { cpu::simd::pin_target(0); }
};

// One thread for the catalogue: under a parallel CTest, several threads per
// test only wait on each other.
TEST_P(IsaPaths, MatchTheDoublePrecisionOperator) {
  ASSERT_EQ(cpu::simd::active_target(), GetParam());
  for (const Case& c : all_mode_cases()) {
    SCOPED_TRACE(c.label());
    const Inputs in = make_inputs(c, 3);
    const OperatorResults<double> want = run_operator<double>(c, in, 1);
    const OperatorResults<float> got = run_operator<float>(c, in, 1);
    EXPECT_CLOSE(got.o, want.o, 2e-4, "o");
    EXPECT_CLOSE(got.gq, want.gq, 2e-4, "grad_q");
    EXPECT_CLOSE(got.gk, want.gk, 2e-4, "grad_k");
    EXPECT_CLOSE(got.gv, want.gv, 2e-4, "grad_v");
    EXPECT_CLOSE(got.gw, want.gw, 2e-4, "grad_w");
  }
}

TEST_P(IsaPaths, RepeatBitForBitAcrossThreadCounts) {
  for (const Case& c :
       {Case{"1d-ragged", 2, 3, 24, 33, TokenLayout::sequence(700, 30)},
        Case{"1d-causal", 1, 2, 17, 40, TokenLayout::sequence(500, 16), Masking::causal},
        Case{"2d", 1, 3, 16, 16, TokenLayout::grid2d(30, 31, 4, 4)}}) {
    SCOPED_TRACE(c.label());
    const Inputs in = make_inputs(c, 5);
    const OperatorResults<float> one = run_operator<float>(c, in, 1);
    EXPECT_TRUE(one == run_operator<float>(c, in, 1)) << "a second run differs";
    EXPECT_TRUE(one == run_operator<float>(c, in, 2)) << "2 threads differ from 1";
    EXPECT_TRUE(one == run_operator<float>(c, in, 3)) << "3 threads differ from 1";
  }
}

TEST_P(IsaPaths, AgreeWithTheBestTargetWithinRounding) {
  const std::vector<int64_t> targets = cpu::simd::runnable_targets();
  for (const Case& c : all_mode_cases()) {
    SCOPED_TRACE(c.label());
    const Inputs in = make_inputs(c, 4);
    const OperatorResults<float> here = run_operator<float>(c, in, 1);
    cpu::simd::pin_target(targets.front());
    const OperatorResults<float> best = run_operator<float>(c, in, 1);
    cpu::simd::pin_target(GetParam());
    const auto widen = [](const std::vector<float>& x) {
      return std::vector<double>(x.begin(), x.end());
    };
    EXPECT_CLOSE(here.o, widen(best.o), 1e-4, "o");
    EXPECT_CLOSE(here.gq, widen(best.gq), 1e-4, "grad_q");
    EXPECT_CLOSE(here.gk, widen(best.gk), 1e-4, "grad_k");
    EXPECT_CLOSE(here.gv, widen(best.gv), 1e-4, "grad_v");
    EXPECT_CLOSE(here.gw, widen(best.gw), 1e-4, "grad_w");
  }
}

INSTANTIATE_TEST_SUITE_P(EveryRunnableTarget, IsaPaths,
                         ::testing::ValuesIn(cpu::simd::runnable_targets()),
                         [](const auto& info) { return cpu::simd::target_name(info.param); });

}  // namespace
}  // namespace mhla::test
