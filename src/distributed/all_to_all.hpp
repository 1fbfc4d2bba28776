#pragma once
// One MPI_Alltoallv of summaries or their gradients: the counts and offsets
// (in values) from what this rank sends to and receives from each rank, the
// exchange itself, and its bytes in the call's traffic.
#include <functional>
#include <vector>

#include "distributed/agreed_call.hpp"
#include "distributed/rank_agreement.hpp"

namespace mhla::distributed {

struct AllToAll {
  std::vector<int> send, send_at, receive, receive_at;
  int64_t sent = 0, received = 0;

  // send_size(r), receive_size(r): values to and from rank r (0: none). The
  // outgoing buffer is packed by destination rank, the incoming by source.
  AllToAll(int ranks, const std::function<int64_t(int)>& send_size,
           const std::function<int64_t(int)>& receive_size)
      : send(size_t(ranks)),
        send_at(size_t(ranks)),
        receive(size_t(ranks)),
        receive_at(size_t(ranks)) {
    for (int r = 0; r < ranks; ++r) {
      send[size_t(r)] = int(send_size(r));
      send_at[size_t(r)] = int(sent);
      sent += send[size_t(r)];
      receive[size_t(r)] = int(receive_size(r));
      receive_at[size_t(r)] = int(received);
      received += receive[size_t(r)];
    }
  }

  // The values rank r sent, or nullptr if it sent none.
  template <typename T>
  const T* from(const std::vector<T>& incoming, int r) const {
    return receive[size_t(r)] > 0 ? incoming.data() + receive_at[size_t(r)] : nullptr;
  }

  // Runs the exchange. With `same_buffer`, outgoing holds one block of values
  // that every destination receives (send_at all zero).
  template <typename T>
  std::vector<T> run(RankAgreement& group, const T* outgoing, bool same_buffer = false) const {
    std::vector<T> incoming(static_cast<size_t>(received));
    const std::vector<int> at = same_buffer ? std::vector<int>(send.size(), 0) : send_at;
    MPI_Alltoallv(outgoing, send.data(), at.data(), mpi_type<T>(), incoming.data(), receive.data(),
                  receive_at.data(), mpi_type<T>(), group.comm());
    group.traffic().summary_bytes_sent += sent * int64_t(sizeof(T));
    group.traffic().summary_bytes_received += received * int64_t(sizeof(T));
    return incoming;
  }
};

}  // namespace mhla::distributed
