// A process forked after a multi-threaded call (Python's multiprocessing,
// torch's DataLoader workers) computes in the child as in the parent: the
// OpenMP runtime's worker pool is not copied by fork(), and without the CPU
// backend's fork handler the child's next parallel region waits forever.
#include <gtest/gtest.h>
#include <omp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <csignal>
#include <vector>

#include "mhla/mixing_init.hpp"
#include "mhla/operator.hpp"

namespace {

std::vector<float> forward_once() {
  constexpr int64_t B = 1, N = 1024, H = 2, D = 16;
  mhla::Options options;
  options.layout = mhla::TokenLayout::sequence(N, 64);
  std::vector<float> q(B * N * H * D), k(q.size()), v(q.size()), o(q.size());
  for (size_t i = 0; i < q.size(); ++i) {
    q[i] = std::sin(0.37f * float(i));
    k[i] = std::cos(0.11f * float(i));
    v[i] = std::sin(0.05f * float(i) + 1.0f);
  }
  const int64_t M = options.layout.num_blocks();
  const std::vector<float> w = mhla::init_mixing(options.layout, {});
  const std::vector<int64_t> shape = {B, N, H, D}, w_shape = {M, M};
  mhla::forward<float>(options, {q.data(), shape}, {k.data(), shape}, {v.data(), shape},
                       {w.data(), w_shape}, {o.data(), shape});
  return o;
}

TEST(Fork, AChildForkedAfterAThreadedCallComputesTheSameResult) {
  omp_set_num_threads(2);  // a worker pool exists in the parent when it forks
  const std::vector<float> in_parent = forward_once();
  const pid_t child = fork();
  ASSERT_GE(child, 0) << "fork failed";
  if (child == 0) {
    alarm(20);  // a hung child ends by SIGALRM, which the parent reports
    _exit(forward_once() == in_parent ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_FALSE(WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
      << "the child hung in its first parallel region after fork()";
  ASSERT_TRUE(WIFEXITED(status)) << "the child ended by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's result differs from the parent's";
  EXPECT_EQ(omp_get_max_threads(), 2) << "the parent's thread count is its own";
}

}  // namespace
