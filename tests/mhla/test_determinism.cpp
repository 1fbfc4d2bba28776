// Each output element is produced by one task in a fixed reduction order, so
// results are bit-identical across runs and across thread counts.
#include <omp.h>

#include <cstring>

#include "test_support.hpp"

namespace mhla::test {
namespace {

struct Results {
  std::vector<float> o, gq, gk, gv, gw;
  bool operator==(const Results& r) const {
    auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    return same(o, r.o) && same(gq, r.gq) && same(gk, r.gk) && same(gv, r.gv) && same(gw, r.gw);
  }
};

Results run(const Case& c, int threads) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  const Inputs in = make_inputs(c, 1);
  const auto q = cast<float>(in.q), k = cast<float>(in.k), v = cast<float>(in.v),
             w = cast<float>(in.w), g = cast<float>(in.grad_o);
  Results r{std::vector<float>(v.size()), std::vector<float>(q.size()),
            std::vector<float>(k.size()), std::vector<float>(v.size()),
            std::vector<float>(w.size())};
  forward<float>(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
                 view(w, c.w_shape()), view(r.o, c.v_shape()));
  backward<float>(c.options(), view(q, c.q_shape()), view(k, c.q_shape()), view(v, c.v_shape()),
                  view(w, c.w_shape()), view(r.o, c.v_shape()), view(g, c.v_shape()),
                  view(r.gq, c.q_shape()), view(r.gk, c.q_shape()), view(r.gv, c.v_shape()),
                  view(r.gw, c.w_shape()));
  omp_set_num_threads(saved);
  return r;
}

TEST(Determinism, IdenticalAcrossRunsAndThreadCounts) {
  // Sizes with several mixing panels (Dk (Dv+1) > 1024) and dW row panels (M > 64).
  for (const Case& c :
       {Case{"1d", 2, 3, 32, 40, TokenLayout::sequence(1000, 10)},
        Case{"1d-causal", 1, 2, 24, 48, TokenLayout::sequence(1300, 16), Masking::causal},
        Case{"2d", 1, 4, 16, 16, TokenLayout::grid2d(30, 31, 4, 4)}}) {
    SCOPED_TRACE(c.label());
    const Results one = run(c, 1);
    EXPECT_TRUE(one == run(c, 1));
    EXPECT_TRUE(one == run(c, 2));
    EXPECT_TRUE(one == run(c, 3));
  }
}

}  // namespace
}  // namespace mhla::test
