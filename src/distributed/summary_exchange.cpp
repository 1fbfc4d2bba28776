// Dense W's exchange: all-to-all of whole shards' summaries, and of their
// gradients back (see summary_exchange.hpp).
#include "distributed/summary_exchange.hpp"

namespace mhla::distributed {

template <typename T>
Sources<T> gather_sources(RankAgreement& group, const Agreed& a, const std::vector<T>& local) {
  if (a.toeplitz_length >= 0) return gather_toeplitz_prefix(group, a, local);
  const int me = group.rank(), ranks = group.size();
  std::vector<int> send(size_t(ranks), 0), send_at(size_t(ranks), 0), receive(size_t(ranks), 0),
      receive_at(size_t(ranks), 0);
  int64_t received = 0;
  for (int r = 0; r < ranks; ++r) {
    if (r == me) continue;
    if (reads_blocks_of(a.masked, r, me)) send[size_t(r)] = int(a.summary_size(me));
    if (reads_blocks_of(a.masked, me, r)) {
      receive[size_t(r)] = int(a.summary_size(r));
      receive_at[size_t(r)] = int(received);
      received += a.summary_size(r);
    }
  }
  std::vector<T> incoming(static_cast<size_t>(received));
  MPI_Alltoallv(local.data(), send.data(), send_at.data(), mpi_type<T>(), incoming.data(),
                receive.data(), receive_at.data(), mpi_type<T>(), group.comm());
  for (int r = 0; r < ranks; ++r)
    group.traffic().summary_bytes_sent += int64_t(send[size_t(r)]) * int64_t(sizeof(T));
  group.traffic().summary_bytes_received += received * int64_t(sizeof(T));

  // All M blocks, as W's rows number them; the blocks this rank does not read stay zero.
  Sources<T> s;
  s.count = a.blocks;
  s.first = a.mine().first_block;
  s.summaries.assign(size_t(a.slices() * a.blocks * a.entry()), T(0));
  for (int r = 0; r < ranks; ++r) {
    const Shard& owner = a.shards[size_t(r)];
    const T* from = r == me                  ? local.data()
                    : receive[size_t(r)] > 0 ? incoming.data() + receive_at[size_t(r)]
                                             : nullptr;
    if (from)
      a.copy_blocks(from, owner.blocks, 0, s.summaries.data(), a.blocks, owner.first_block,
                    owner.blocks);
  }
  return s;
}

template <typename T>
std::vector<T> return_source_gradients(RankAgreement& group, const Agreed& a,
                                       const Sources<T>& sources,
                                       const std::vector<T>& grad_sources) {
  if (a.toeplitz_length >= 0)
    return return_toeplitz_prefix_gradients(group, a, sources, grad_sources);
  const int me = group.rank(), ranks = group.size();
  std::vector<int> send(size_t(ranks), 0), send_at(size_t(ranks), 0), receive(size_t(ranks), 0),
      receive_at(size_t(ranks), 0);
  int64_t sent = 0, received = 0;
  for (int r = 0; r < ranks; ++r) {
    if (r == me) continue;
    if (reads_blocks_of(a.masked, me, r)) {
      send[size_t(r)] = int(a.summary_size(r));
      send_at[size_t(r)] = int(sent);
      sent += a.summary_size(r);
    }
    if (reads_blocks_of(a.masked, r, me)) {
      receive[size_t(r)] = int(a.summary_size(me));
      receive_at[size_t(r)] = int(received);
      received += a.summary_size(me);
    }
  }
  std::vector<T> outgoing(static_cast<size_t>(sent)), incoming(static_cast<size_t>(received));
  for (int r = 0; r < ranks; ++r)
    if (send[size_t(r)] > 0) {
      const Shard& owner = a.shards[size_t(r)];
      a.copy_blocks(grad_sources.data(), a.blocks, owner.first_block,
                    outgoing.data() + send_at[size_t(r)], owner.blocks, 0, owner.blocks);
    }
  MPI_Alltoallv(outgoing.data(), send.data(), send_at.data(), mpi_type<T>(), incoming.data(),
                receive.data(), receive_at.data(), mpi_type<T>(), group.comm());
  group.traffic().summary_bytes_sent += sent * int64_t(sizeof(T));
  group.traffic().summary_bytes_received += received * int64_t(sizeof(T));

  // Sum over the readers in rank order, this rank's own share at its place.
  const Shard& mine = a.mine();
  std::vector<T> total(size_t(a.summary_size(me)), T(0)), own(total.size());
  a.copy_blocks(grad_sources.data(), a.blocks, mine.first_block, own.data(), mine.blocks, 0,
                mine.blocks);
  for (int r = 0; r < ranks; ++r) {
    const T* part = r == me                  ? own.data()
                    : receive[size_t(r)] > 0 ? incoming.data() + receive_at[size_t(r)]
                                             : nullptr;
    if (part)
      for (size_t i = 0; i < total.size(); ++i) total[i] += part[i];
  }
  return total;
}

template Sources<float> gather_sources(RankAgreement&, const Agreed&, const std::vector<float>&);
template Sources<double> gather_sources(RankAgreement&, const Agreed&, const std::vector<double>&);
template std::vector<float> return_source_gradients(RankAgreement&, const Agreed&,
                                                    const Sources<float>&,
                                                    const std::vector<float>&);
template std::vector<double> return_source_gradients(RankAgreement&, const Agreed&,
                                                     const Sources<double>&,
                                                     const std::vector<double>&);

}  // namespace mhla::distributed
