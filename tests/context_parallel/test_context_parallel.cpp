// Context-parallel MHLA over MPI equals the one-process operator on the whole
// sequence: every mode of the catalogue, shards of uneven size with a
// single-block rank first or last, forward and all four gradients, fp64 to
// 1e-12 and fp32 against fp64; and a second call gives bit-identical results.
// Run under mpirun with 1 to 4 ranks (tests/CMakeLists.txt).
#include <mpi.h>

#include "context_parallel/mpi_world.hpp"
#include "mhla/context_parallel_mpi.hpp"
#include "test_support.hpp"

namespace mhla::test {
namespace {

// The catalogue's layouts plus grids with enough tile rows (frames) to give
// every one of four ranks a shard.
std::vector<Case> context_parallel_cases() {
  std::vector<Case> shapes = shape_cases();
  shapes.push_back({"2d-six-tile-rows", 1, 2, 3, 4, TokenLayout::grid2d(12, 5, 2, 2)});
  shapes.push_back({"3d-five-frame-tiles", 1, 2, 4, 3, TokenLayout::grid3d(9, 3, 4, 2, 2, 3)});
  return with_all_modes(shapes);
}

// Tiles along the layout's first axis (the unit a shard is made of).
int64_t tile_slices(const TokenLayout& layout) { return layout.block_grid()[3 - layout.rank()]; }

// Tokens per rank: one tile slice for the first (or last) rank, the others as
// even as possible; the last rank ends with the ragged edge.
std::vector<int64_t> split(const TokenLayout& layout, int ranks, bool single_first) {
  const int a = 3 - layout.rank();
  int64_t slice_tokens = 1;
  for (int d = a + 1; d < 3; ++d) slice_tokens *= layout.grid()[d];
  const int64_t slices = tile_slices(layout), tile = layout.tile()[a];
  std::vector<int64_t> counts(size_t(ranks), 1);
  if (ranks > 1) {
    const int64_t rest = slices - 1, others = ranks - 1;
    for (int64_t r = 0; r < others; ++r)
      counts[size_t(single_first ? r + 1 : r)] = rest / others + (r < rest % others ? 1 : 0);
  } else {
    counts[0] = slices;
  }
  std::vector<int64_t> tokens;
  int64_t start = 0;
  for (int r = 0; r < ranks; ++r) {
    const int64_t end = r == ranks - 1 ? layout.grid()[a] : start + counts[size_t(r)] * tile;
    tokens.push_back((end - start) * slice_tokens);
    start = end;
  }
  return tokens;
}

// Rows [first, first + count) of every batch entry of a [B, N, H, D] tensor.
template <typename T>
std::vector<T> rows(const std::vector<T>& x, const std::vector<int64_t>& shape, int64_t first,
                    int64_t count) {
  const int64_t n = shape[1], row = shape[2] * shape[3];
  std::vector<T> out;
  for (int64_t b = 0; b < shape[0]; ++b)
    out.insert(out.end(), x.begin() + (b * n + first) * row,
               x.begin() + (b * n + first + count) * row);
  return out;
}

// This rank's context-parallel results on its shard of `in`.
template <typename T>
OperatorResults<T> run_shard(const Case& c, const Inputs& in, const Shard& s) {
  const std::vector<int64_t> q_shape = {c.batch, s.tokens, c.heads, c.dk},
                             v_shape = {c.batch, s.tokens, c.heads, c.dv};
  const auto q = cast<T>(rows(in.q, c.q_shape(), s.first_token, s.tokens)),
             k = cast<T>(rows(in.k, c.q_shape(), s.first_token, s.tokens)),
             v = cast<T>(rows(in.v, c.v_shape(), s.first_token, s.tokens)),
             g = cast<T>(rows(in.grad_o, c.v_shape(), s.first_token, s.tokens)), w = cast<T>(in.w);
  OperatorResults<T> r{std::vector<T>(v.size()), std::vector<T>(q.size()), std::vector<T>(k.size()),
                       std::vector<T>(v.size()), std::vector<T>(w.size())};
  const Options options = c.options();
  context_parallel_forward<T>(MPI_COMM_WORLD, options, view(q, q_shape), view(k, q_shape),
                              view(v, v_shape), view(w, c.w_shape()), view(r.o, v_shape));
  context_parallel_backward<T>(MPI_COMM_WORLD, options, view(q, q_shape), view(k, q_shape),
                               view(v, v_shape), view(w, c.w_shape()), view(r.o, v_shape),
                               view(g, v_shape), view(r.gq, q_shape), view(r.gk, q_shape),
                               view(r.gv, v_shape), view(r.gw, c.w_shape()));
  return r;
}

// The one-process operator in double on the whole sequence, cut to the shard.
OperatorResults<double> whole_sequence(const Case& c, const Inputs& in, const Shard& s) {
  OperatorResults<double> r = run_operator<double>(c, in, omp_get_max_threads());
  r.o = rows(r.o, c.v_shape(), s.first_token, s.tokens);
  r.gq = rows(r.gq, c.q_shape(), s.first_token, s.tokens);
  r.gk = rows(r.gk, c.q_shape(), s.first_token, s.tokens);
  r.gv = rows(r.gv, c.v_shape(), s.first_token, s.tokens);
  return r;
}

template <typename T>
void expect_equal_to_one_process(const Case& c, bool single_first, double tolerance) {
  Inputs in = make_inputs(c, 17);
  if (sizeof(T) == 4)  // the reference sees the same rounded inputs
    for (auto* x : {&in.q, &in.k, &in.v, &in.w, &in.grad_o})
      for (double& e : *x) e = double(float(e));
  const Shard s =
      plan_shards(c.layout, split(c.layout, world_size(), single_first))[size_t(world_rank())];
  const OperatorResults<T> got = run_shard<T>(c, in, s);
  const OperatorResults<double> want = whole_sequence(c, in, s);
  const std::string where = std::string(sizeof(T) == 4 ? "fp32" : "fp64") + " rank " +
                            std::to_string(world_rank()) + " tokens " +
                            std::to_string(s.first_token) + "+" + std::to_string(s.tokens);
  EXPECT_CLOSE(got.o, want.o, tolerance, where + " o");
  EXPECT_CLOSE(got.gq, want.gq, tolerance, where + " grad_q");
  EXPECT_CLOSE(got.gk, want.gk, tolerance, where + " grad_k");
  EXPECT_CLOSE(got.gv, want.gv, tolerance, where + " grad_v");
  EXPECT_CLOSE(got.gw, want.gw, tolerance, where + " grad_w");
  if (single_first) {  // a second call: same bits (every sum in a fixed order)
    EXPECT_TRUE(run_shard<T>(c, in, s) == got) << where << ": a second call differs";
  }
}

class ContextParallel : public testing::TestWithParam<Case> {};

TEST_P(ContextParallel, EqualsOneProcessOnTheWholeSequence) {
  const Case& c = GetParam();
  if (tile_slices(c.layout) < world_size()) GTEST_SKIP() << "fewer tile slices than ranks";
  for (bool single_first : {true, false}) {
    expect_equal_to_one_process<double>(c, single_first, 1e-12);
    expect_equal_to_one_process<float>(c, single_first, 2e-4);
  }
}

INSTANTIATE_TEST_SUITE_P(AllModes, ContextParallel, testing::ValuesIn(context_parallel_cases()),
                         case_name);

}  // namespace
}  // namespace mhla::test
