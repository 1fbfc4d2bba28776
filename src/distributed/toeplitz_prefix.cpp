// Toeplitz w's exchange: an exclusive prefix sum of the ranks' summaries plus
// a window of L - 1 individual blocks (see summary_exchange.hpp).
//
// Rank r, first block b0, mixes over [A | window | own blocks] where the
// window is blocks b0 - K .. b0 - 1 (K = min(b0, L - 1)) and A, present when
// blocks remain before the window, is the sum of blocks 0 .. b0 - K - 1. In
// these sources A sits K + 1 places before the first own block, at distance
// >= L from every own row, so w[min(distance, L)] gives it w[L], as each of
// the blocks it sums has; the window keeps its true distances.
#include <algorithm>
#include <utility>

#include "distributed/summary_exchange.hpp"

#include "distributed/all_to_all.hpp"

namespace mhla::distributed {
namespace {

struct Window {
  int64_t first = 0, blocks = 0;  // blocks first .. first + blocks - 1
  bool aggregate = false;         // A present
};

Window window_of(const Agreed& a, int r) {
  const int64_t b0 = a.shards[size_t(r)].first_block;
  const int64_t k = std::min(b0, std::max<int64_t>(a.toeplitz_length - 1, 0));
  return {b0 - k, k, b0 - k > 0};
}

// The blocks of `owner` inside the window of `reader` (a later rank).
std::pair<int64_t, int64_t> overlap(const Agreed& a, int owner, int reader) {
  if (owner >= reader) return {0, 0};
  const Window w = window_of(a, reader);
  const Shard& s = a.shards[size_t(owner)];
  const int64_t lo = std::max(w.first, s.first_block),
                hi = std::min(w.first + w.blocks, s.first_block + s.blocks);
  return {lo, std::max(lo, hi)};
}

}  // namespace

template <typename T>
Sources<T> gather_toeplitz_prefix(RankAgreement& group, const Agreed& a,
                                  const std::vector<T>& local) {
  const int me = group.rank(), ranks = group.size();
  const Shard& mine = a.mine();
  const int64_t e = a.entry(), slice_values = a.slices() * e;

  // The sum of every block before this rank's, from the ranks' totals.
  std::vector<T> total(size_t(slice_values), T(0)), before(total.size(), T(0));
  for (int64_t s = 0; s < a.slices(); ++s)
    for (int64_t b = 0; b < mine.blocks; ++b)
      for (int64_t x = 0; x < e; ++x)
        total[size_t(s * e + x)] += local[size_t((s * mine.blocks + b) * e + x)];
  MPI_Exscan(total.data(), before.data(), int(slice_values), mpi_type<T>(), MPI_SUM, group.comm());
  if (me == 0) std::fill(before.begin(), before.end(), T(0));  // Exscan leaves rank 0's undefined
  group.traffic().summary_bytes_sent += slice_values * int64_t(sizeof(T));
  if (me > 0) group.traffic().summary_bytes_received += slice_values * int64_t(sizeof(T));

  // The window's blocks from their owners.
  auto blocks = [&](std::pair<int64_t, int64_t> range) {
    return a.slices() * (range.second - range.first) * e;
  };
  const AllToAll plan(
      ranks, [&](int r) { return blocks(overlap(a, me, r)); },
      [&](int r) { return blocks(overlap(a, r, me)); });
  std::vector<T> outgoing(static_cast<size_t>(plan.sent));
  for (int r = 0; r < ranks; ++r) {
    const auto [lo, hi] = overlap(a, me, r);
    if (hi > lo)
      a.copy_blocks(local.data(), mine.blocks, lo - mine.first_block,
                    outgoing.data() + plan.send_at[size_t(r)], hi - lo, 0, hi - lo);
  }
  const std::vector<T> incoming = plan.run(group, outgoing.data());

  const Window w = window_of(a, me);
  Sources<T> s;
  s.first = int64_t(w.aggregate) + w.blocks;
  s.count = s.first + mine.blocks;
  s.summaries.assign(size_t(a.slices() * s.count * e), T(0));
  for (int r = 0; r < ranks; ++r) {
    const auto [lo, hi] = overlap(a, r, me);
    if (hi > lo)
      a.copy_blocks(plan.from(incoming, r), hi - lo, 0, s.summaries.data(), s.count,
                    int64_t(w.aggregate) + lo - w.first, hi - lo);
  }
  a.copy_blocks(local.data(), mine.blocks, 0, s.summaries.data(), s.count, s.first, mine.blocks);
  if (w.aggregate)  // A = (all blocks before) - (the window)
    for (int64_t sl = 0; sl < a.slices(); ++sl)
      for (int64_t x = 0; x < e; ++x) {
        T value = before[size_t(sl * e + x)];
        for (int64_t k = 0; k < w.blocks; ++k)
          value -= s.summaries[size_t((sl * s.count + 1 + k) * e + x)];
        s.summaries[size_t(sl * s.count * e + x)] = value;
      }
  return s;
}

template <typename T>
std::vector<T> return_toeplitz_prefix_gradients(RankAgreement& group, const Agreed& a,
                                                const Sources<T>& sources,
                                                const std::vector<T>& grad_sources) {
  const int me = group.rank(), ranks = group.size();
  const Shard& mine = a.mine();
  const int64_t e = a.entry(), slice_values = a.slices() * e;
  const Window w = window_of(a, me);

  // A's gradient reaches every block it sums.
  std::vector<T> grad_a(size_t(slice_values), T(0));
  if (w.aggregate)
    for (int64_t sl = 0; sl < a.slices(); ++sl)
      for (int64_t x = 0; x < e; ++x)
        grad_a[size_t(sl * e + x)] = grad_sources[size_t(sl * sources.count * e + x)];

  // To each owner of window blocks: A's gradient, then the window blocks'.
  auto message_size = [&](std::pair<int64_t, int64_t> range) {
    const int64_t count = range.second - range.first;
    return count > 0 ? slice_values + a.slices() * count * e : 0;
  };
  const AllToAll plan(
      ranks, [&](int r) { return message_size(overlap(a, r, me)); },
      [&](int r) { return message_size(overlap(a, me, r)); });
  std::vector<T> outgoing(static_cast<size_t>(plan.sent));
  for (int r = 0; r < ranks; ++r) {
    const auto [lo, hi] = overlap(a, r, me);
    if (hi <= lo) continue;
    T* out = outgoing.data() + plan.send_at[size_t(r)];
    std::copy(grad_a.begin(), grad_a.end(), out);
    a.copy_blocks(grad_sources.data(), sources.count, int64_t(w.aggregate) + lo - w.first,
                  out + slice_values, hi - lo, 0, hi - lo);
  }
  const std::vector<T> incoming = plan.run(group, outgoing.data());

  // The sum of A's gradients over the later ranks: the total less the
  // inclusive prefix. A later rank whose window holds a block gave that
  // block its window gradient instead, so its A gradient is taken back there.
  std::vector<T> all(grad_a.size()), upto(grad_a.size());
  MPI_Allreduce(grad_a.data(), all.data(), int(slice_values), mpi_type<T>(), MPI_SUM, group.comm());
  MPI_Scan(grad_a.data(), upto.data(), int(slice_values), mpi_type<T>(), MPI_SUM, group.comm());
  group.traffic().summary_bytes_sent += 2 * slice_values * int64_t(sizeof(T));
  group.traffic().summary_bytes_received += 2 * slice_values * int64_t(sizeof(T));

  std::vector<T> grad(size_t(a.summary_size(me)), T(0));
  a.copy_blocks(grad_sources.data(), sources.count, sources.first, grad.data(), mine.blocks, 0,
                mine.blocks);
  for (int r = me + 1; r < ranks; ++r) {
    const auto [lo, hi] = overlap(a, me, r);
    if (hi <= lo) continue;
    const T* message = plan.from(incoming, r);
    const T* blocks = message + slice_values;
    for (int64_t sl = 0; sl < a.slices(); ++sl)
      for (int64_t k = 0; k < hi - lo; ++k)
        for (int64_t x = 0; x < e; ++x)
          grad[size_t((sl * mine.blocks + lo - mine.first_block + k) * e + x)] +=
              blocks[size_t((sl * (hi - lo) + k) * e + x)] - message[size_t(sl * e + x)];
  }
  for (int64_t sl = 0; sl < a.slices(); ++sl)
    for (int64_t b = 0; b < mine.blocks; ++b)
      for (int64_t x = 0; x < e; ++x)
        grad[size_t((sl * mine.blocks + b) * e + x)] +=
            all[size_t(sl * e + x)] - upto[size_t(sl * e + x)];
  return grad;
}

template Sources<float> gather_toeplitz_prefix(RankAgreement&, const Agreed&,
                                               const std::vector<float>&);
template Sources<double> gather_toeplitz_prefix(RankAgreement&, const Agreed&,
                                                const std::vector<double>&);
template std::vector<float> return_toeplitz_prefix_gradients(RankAgreement&, const Agreed&,
                                                             const Sources<float>&,
                                                             const std::vector<float>&);
template std::vector<double> return_toeplitz_prefix_gradients(RankAgreement&, const Agreed&,
                                                              const Sources<double>&,
                                                              const std::vector<double>&);

}  // namespace mhla::distributed
