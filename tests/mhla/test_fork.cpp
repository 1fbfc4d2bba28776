// A process forked after a multi-threaded call (Python's multiprocessing,
// torch's DataLoader workers) computes in the child as in the parent: the
// OpenMP runtime's worker pool is not copied by fork(), and without the CPU
// backend's fork handler the child's next parallel region waits forever.
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include "test_support.hpp"

namespace mhla::test {
namespace {

TEST(Fork, AChildForkedAfterAThreadedCallComputesTheSameResult) {
  omp_set_num_threads(2);
  const Case c{"1d", 1, 2, 16, 16, TokenLayout::sequence(1024, 64)};
  const Inputs in = make_inputs(c, 1);
  // Forward and backward on 2 threads: a worker pool exists in the parent when it forks.
  const OperatorResults<float> in_parent = run_operator<float>(c, in, 2);
  const pid_t child = fork();
  ASSERT_GE(child, 0) << "fork failed";
  if (child == 0) {
    alarm(20);  // a hung child ends by SIGALRM, which the parent reports
    // On the thread count the child was left with (the handler's).
    _exit(run_operator<float>(c, in, omp_get_max_threads()) == in_parent ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_FALSE(WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
      << "the child hung in its first parallel region after fork()";
  ASSERT_TRUE(WIFEXITED(status)) << "the child ended by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's results differ from the parent's";
  EXPECT_EQ(omp_get_max_threads(), 2) << "the parent's thread count is its own";
}

}  // namespace
}  // namespace mhla::test
