#pragma once
// Keeps the ranks of a collective call in step when one of them fails. Each
// step of local work runs under run(); before the next exchange all ranks
// learn whether any rank's step threw, and if one did every rank throws the
// same mhla::Error naming the lowest failing rank. Without this, the ranks
// that did not fail would wait forever in the next collective.
#include <mpi.h>

#include <exception>
#include <string>

#include "mhla/context_parallel_mpi.hpp"

namespace mhla::distributed {

class RankAgreement {
 public:
  RankAgreement(MPI_Comm comm, const char* fn, ContextParallelTraffic& traffic);

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm comm() const { return comm_; }
  const char* fn() const { return fn_; }
  ContextParallelTraffic& traffic() { return traffic_; }

  template <typename Work>
  void run(Work&& work) {
    std::string error;
    try {
      work();
    } catch (const std::exception& e) {
      error = e.what();
      if (error.empty()) error = "unnamed error";
    }
    settle(error);
  }

  // Every rank calls this with its own error ("" for none).
  void settle(const std::string& local_error);

 private:
  MPI_Comm comm_;
  const char* fn_;
  ContextParallelTraffic& traffic_;
  int rank_ = 0, size_ = 1;
};

}  // namespace mhla::distributed
