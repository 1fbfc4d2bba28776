#include "distributed/rank_agreement.hpp"

#include <algorithm>
#include <array>
#include <cstring>

#include "mhla/error.hpp"

namespace mhla::distributed {

RankAgreement::RankAgreement(MPI_Comm comm, const char* fn, ContextParallelTraffic& traffic)
    : comm_(comm), fn_(fn), traffic_(traffic) {
  MPI_Comm_rank(comm, &rank_);
  MPI_Comm_size(comm, &size_);
}

void RankAgreement::settle(const std::string& local_error) {
  // The lowest failing rank speaks for all: one integer reduction when every
  // rank succeeded, one broadcast of its message otherwise.
  const int mine = local_error.empty() ? size_ : rank_;
  int first = size_;
  MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm_);
  traffic_.control_bytes += int64_t(sizeof mine);
  if (first == size_) return;
  std::array<char, 1024> message{};
  if (rank_ == first)
    std::memcpy(message.data(), local_error.data(),
                std::min(local_error.size(), message.size() - 1));
  MPI_Bcast(message.data(), int(message.size()), MPI_CHAR, first, comm_);
  if (rank_ == first) traffic_.control_bytes += int64_t(message.size());
  throw Error(std::string(fn_) + ": rank " + std::to_string(first) + ": " + message.data());
}

}  // namespace mhla::distributed
