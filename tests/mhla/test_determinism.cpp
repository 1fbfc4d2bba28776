// Each output element is produced by one task in a fixed reduction order, so
// results are bit-identical across runs and across thread counts.
#include "test_support.hpp"

namespace mhla::test {
namespace {

TEST(Determinism, IdenticalAcrossRunsAndThreadCounts) {
  // Sizes with several mixing panels (Dk (Dv+1) > 1024) and dW row panels (M > 64).
  for (const Case& c :
       {Case{"1d", 2, 3, 32, 40, TokenLayout::sequence(1000, 10)},
        Case{"1d-causal", 1, 2, 24, 48, TokenLayout::sequence(1300, 16), Masking::causal},
        Case{"2d", 1, 4, 16, 16, TokenLayout::grid2d(30, 31, 4, 4)}}) {
    SCOPED_TRACE(c.label());
    const Inputs in = make_inputs(c, 1);
    const OperatorResults<float> one = run_operator<float>(c, in, 1);
    EXPECT_TRUE(one == run_operator<float>(c, in, 1));
    EXPECT_TRUE(one == run_operator<float>(c, in, 2));
    EXPECT_TRUE(one == run_operator<float>(c, in, 3));
  }
}

}  // namespace
}  // namespace mhla::test
