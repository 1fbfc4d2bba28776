// A problem on one rank of a context-parallel call becomes the same named
// error on every rank, never a hang: shards that do not end at a block
// boundary, ranks that disagree on sizes, options or w, a rank whose inputs
// its own checks refuse, a non-finite result on one rank. Run under mpirun
// with 2 or 3 ranks; dead_rank.sh covers a rank that dies.
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>

#include "context_parallel/mpi_world.hpp"
#include "mhla/context_parallel_mpi.hpp"
#include "test_support.hpp"

namespace mhla::test {
namespace {

using testing::HasSubstr;


// One rank's call: 1D, 4 tokens per block, 2 blocks per rank unless changed.
struct Call {
  int64_t tokens = 8, dk = 3, dv = 4;
  Options options;
  std::vector<double> q, k, v, w, o, grad_o;
  std::vector<int64_t> q_shape, k_shape, v_shape, w_shape;

  Call() {
    const int64_t blocks = 2 * world_size();
    options.layout = TokenLayout::sequence(4 * blocks, 4);
    options.masking = Masking::block_causal;
    w_shape = {blocks, blocks};
    w.assign(size_t(blocks * blocks), 0.5);
    resize();
  }
  void resize() {
    q_shape = k_shape = {1, tokens, 2, dk};
    v_shape = {1, tokens, 2, dv};
    q.assign(size_t(numel(q_shape)), 0.25);
    k.assign(size_t(numel(k_shape)), 0.5);
    v.assign(size_t(numel(v_shape)), 1.0);
    o.assign(v.size(), 0.0);
    grad_o.assign(v.size(), 1.0);
  }
  void forward() {
    context_parallel_forward<double>(MPI_COMM_WORLD, options, view(q, q_shape), view(k, k_shape),
                                     view(v, v_shape), view(w, w_shape), view(o, v_shape));
  }
};

// The error every rank must see; "" if the call succeeded.
std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

class Faults : public testing::Test {
 protected:
  void SetUp() override {
    if (world_size() < 2) GTEST_SKIP() << "needs 2 or more ranks";
  }
  const int rank = world_rank();
};

TEST_F(Faults, AShardThatEndsInsideABlockIsNamedOnEveryRank) {
  Call c;
  if (rank == 0) c.tokens = 6;  // blocks of 4: rank 0 ends inside block 1
  if (rank == 1) c.tokens = 10;
  c.resize();
  EXPECT_THAT(error_of([&] { c.forward(); }),
              HasSubstr("mhla::context_parallel_forward: mhla::plan_shards: rank 0 holds tokens "
                        "0..5, which ends inside block 1"));
}

TEST_F(Faults, TokensThatDoNotAddUpToTheLayoutAreNamed) {
  Call c;
  if (rank == 1) c.tokens = 4;
  c.resize();
  EXPECT_THAT(error_of([&] { c.forward(); }), HasSubstr("tokens in all, but the layout"));
}

TEST_F(Faults, RanksThatDisagreeOnSizesOptionsOrWAreNamed) {
  Call dv;
  if (rank == 1) dv.dv = 5;
  dv.resize();
  EXPECT_THAT(error_of([&] { dv.forward(); }),
              HasSubstr("rank 1 disagrees with rank 0 on value size Dv: 5 vs 4"));
  Call masking;
  if (rank == world_size() - 1) masking.options.masking = Masking::none;
  EXPECT_THAT(error_of([&] { masking.forward(); }),
              HasSubstr("rank " + std::to_string(world_size() - 1) +
                        " disagrees with rank 0 on masking: none vs block_causal"));
  Call w;
  if (rank == 1) w.w[1] = 0.25;
  EXPECT_THAT(error_of([&] { w.forward(); }),
              HasSubstr("rank 1 disagrees with rank 0 on w's values"));
}

TEST_F(Faults, InputsOneRankRefusesAreReportedByEveryRank) {
  Call rank3;
  if (rank == 1) rank3.q_shape = {rank3.tokens, 2, rank3.dk};
  EXPECT_THAT(error_of([&] { rank3.forward(); }),
              HasSubstr("mhla::context_parallel_forward: rank 1: q has shape [8, 2, 3]; expected "
                        "[B, N_r, H, Dk]"));
  Call k;
  if (rank == 1) k.k_shape = {1, k.tokens, 1, 2 * k.dk};  // same size, other heads and Dk
  EXPECT_THAT(error_of([&] { k.forward(); }),
              HasSubstr("mhla::context_parallel_forward: rank 1: mhla::block_summaries"));
}

TEST_F(Faults, ANonFiniteResultOnOneRankIsReportedByEveryRank) {
  Call c;
  if (rank == 1) c.q[3] = c.k[3] = 1e200;  // finite inputs whose products overflow
  EXPECT_THAT(error_of([&] { c.forward(); }),
              HasSubstr("mhla::context_parallel_forward: rank 1: mhla::read_out"));
}

TEST_F(Faults, BackwardNamesAGradientOfTheWrongShape) {
  Call c;
  c.forward();
  std::vector<double> gq(c.q.size()), gk(c.k.size()), gv(c.v.size()), gw(c.w.size());
  std::vector<int64_t> grad_q_shape = c.q_shape;
  if (rank == 0) grad_q_shape[3] = 1;
  EXPECT_THAT(error_of([&] {
                context_parallel_backward<double>(
                    MPI_COMM_WORLD, c.options, view(c.q, c.q_shape), view(c.k, c.k_shape),
                    view(c.v, c.v_shape), view(c.w, c.w_shape), view(c.o, c.v_shape),
                    view(c.grad_o, c.v_shape), view(gq, grad_q_shape), view(gk, c.k_shape),
                    view(gv, c.v_shape), view(gw, c.w_shape));
              }),
              HasSubstr("mhla::context_parallel_backward: rank 0: grad_q has shape [1, 8, 2, 1]"));
}

// Only under dead_rank.sh: the chosen rank dies before the call; the others
// enter it. mpirun must end the job with an error instead of letting them wait.
TEST_F(Faults, ARankThatDiesEndsTheJob) {
  const char* victim = std::getenv("MHLA_TEST_KILL_RANK");
  if (!victim) GTEST_SKIP() << "run by dead_rank.sh";
  Call c;
  if (rank == std::atoi(victim)) kill(getpid(), SIGKILL);
  c.forward();
  ADD_FAILURE() << "the call returned although a rank died";
}

}  // namespace
}  // namespace mhla::test
