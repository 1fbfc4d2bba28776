// Dense W's exchange: all-to-all of whole shards' summaries, and of their
// gradients back (see summary_exchange.hpp).
#include "distributed/summary_exchange.hpp"

#include "distributed/all_to_all.hpp"

namespace mhla::distributed {

template <typename T>
Sources<T> gather_sources(RankAgreement& group, const Agreed& a, const std::vector<T>& local) {
  if (a.toeplitz_length >= 0) return gather_toeplitz_prefix(group, a, local);
  const int me = group.rank(), ranks = group.size();
  // Each reader gets this rank's whole summaries: one buffer for all of them.
  const AllToAll plan(
      ranks,
      [&](int r) { return r != me && reads_blocks_of(a.masked, r, me) ? a.summary_size(me) : 0; },
      [&](int r) { return r != me && reads_blocks_of(a.masked, me, r) ? a.summary_size(r) : 0; });
  const std::vector<T> incoming = plan.run(group, local.data(), true);

  // All M blocks, as W's rows number them; the blocks this rank does not read stay zero.
  Sources<T> s;
  s.count = a.blocks;
  s.first = a.mine().first_block;
  s.summaries.assign(size_t(a.slices() * a.blocks * a.entry()), T(0));
  for (int r = 0; r < ranks; ++r) {
    const Shard& owner = a.shards[size_t(r)];
    const T* from = r == me ? local.data() : plan.from(incoming, r);
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
  const AllToAll plan(
      ranks,
      [&](int r) { return r != me && reads_blocks_of(a.masked, me, r) ? a.summary_size(r) : 0; },
      [&](int r) { return r != me && reads_blocks_of(a.masked, r, me) ? a.summary_size(me) : 0; });
  std::vector<T> outgoing(static_cast<size_t>(plan.sent));
  for (int r = 0; r < ranks; ++r)
    if (plan.send[size_t(r)] > 0) {
      const Shard& owner = a.shards[size_t(r)];
      a.copy_blocks(grad_sources.data(), a.blocks, owner.first_block,
                    outgoing.data() + plan.send_at[size_t(r)], owner.blocks, 0, owner.blocks);
    }
  const std::vector<T> incoming = plan.run(group, outgoing.data());

  // Sum over the readers in rank order, this rank's own share at its place.
  const Shard& mine = a.mine();
  std::vector<T> total(size_t(a.summary_size(me)), T(0)), own(total.size());
  a.copy_blocks(grad_sources.data(), a.blocks, mine.first_block, own.data(), mine.blocks, 0,
                mine.blocks);
  for (int r = 0; r < ranks; ++r) {
    const T* part = r == me ? own.data() : plan.from(incoming, r);
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
