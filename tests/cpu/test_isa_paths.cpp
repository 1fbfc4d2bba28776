// The whole float operator on every instruction set this CPU runs: forward
// and every gradient against the fp64 operator on the catalogue of modes and
// awkward shapes, bit-identical across thread counts on each instruction set,
// and the instruction sets within rounding of each other.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>

#include "cpu/simd/isa.hpp"
#include "test_support.hpp"

namespace mhla::test {
namespace {

struct Outputs {
  std::vector<float> o, gq, gk, gv, gw;
  bool operator==(const Outputs& r) const {
    auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    return same(o, r.o) && same(gq, r.gq) && same(gk, r.gk) && same(gv, r.gv) && same(gw, r.gw);
  }
};

template <typename T>
struct Results {
  std::vector<T> o, gq, gk, gv, gw;
};

template <typename T>
Results<T> run(const Case& c, const Inputs& in, int threads) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  const auto q = cast<T>(in.q), k = cast<T>(in.k), v = cast<T>(in.v), w = cast<T>(in.w),
             g = cast<T>(in.grad_o);
  Results<T> r{std::vector<T>(v.size()), std::vector<T>(q.size()), std::vector<T>(k.size()),
               std::vector<T>(v.size()), std::vector<T>(w.size())};
  forward<T>(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
             view(w, c.w_shape()), view(r.o, c.v_shape()));
  backward<T>(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
              view(w, c.w_shape()), view(r.o, c.v_shape()), view(g, c.v_shape()),
              view(r.gq, c.q_shape()), view(r.gk, c.q_shape()), view(r.gv, c.v_shape()),
              view(r.gw, c.w_shape()));
  omp_set_num_threads(saved);
  return r;
}

Outputs as_outputs(Results<float> r) {
  return {std::move(r.o), std::move(r.gq), std::move(r.gk), std::move(r.gv), std::move(r.gw)};
}

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
    const Results<double> want = run<double>(c, in, 1);
    const Results<float> got = run<float>(c, in, 1);
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
    const Outputs one = as_outputs(run<float>(c, in, 1));
    EXPECT_TRUE(one == as_outputs(run<float>(c, in, 1))) << "a second run differs";
    EXPECT_TRUE(one == as_outputs(run<float>(c, in, 2))) << "2 threads differ from 1";
    EXPECT_TRUE(one == as_outputs(run<float>(c, in, 3))) << "3 threads differ from 1";
  }
}

TEST_P(IsaPaths, AgreeWithTheBestTargetWithinRounding) {
  const std::vector<int64_t> targets = cpu::simd::runnable_targets();
  for (const Case& c : all_mode_cases()) {
    SCOPED_TRACE(c.label());
    const Inputs in = make_inputs(c, 4);
    const Results<float> here = run<float>(c, in, 1);
    cpu::simd::pin_target(targets.front());
    const Results<float> best = run<float>(c, in, 1);
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
