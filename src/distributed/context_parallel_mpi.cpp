// Context-parallel forward and backward over MPI, built on the public phase
// functions (mhla/phases.hpp). See mhla/context_parallel_mpi.hpp.
#include "mhla/context_parallel_mpi.hpp"

#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

#include "distributed/call_descriptor.hpp"
#include "distributed/rank_agreement.hpp"
#include "mhla/error.hpp"
#include "mhla/phases.hpp"
#include "mhla/shards.hpp"

namespace mhla {
namespace {

using distributed::RankAgreement;

template <typename T>
MPI_Datatype mpi_type() {
  return sizeof(T) == 4 ? MPI_FLOAT : MPI_DOUBLE;
}

int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t e : shape) n *= e;
  return n;
}

// What the ranks agreed on: the shards, this rank's options (its own layout),
// and the summary sizes.
struct Agreed {
  std::vector<Shard> shards;
  Options local;
  int64_t batch = 0, heads = 0, dk = 0, dv = 0, blocks = 0;
  bool masked = false;
  int64_t entry() const { return dk * (dv + 1); }  // one block's summary, per (b, h)
  int64_t summary_size(int r) const { return batch * heads * shards[size_t(r)].blocks * entry(); }
  std::vector<int64_t> summary_shape(int64_t m) const { return {batch, heads, m, dk, dv + 1}; }
};

// Every rank checks its own call, then the ranks compare their calls and
// agree on the shards. Afterwards all ranks run the same collectives.
template <typename T>
Agreed agree_on_call(RankAgreement& group, const Options& options, const TensorView<const T>& q,
                     const TensorView<const T>& v, const TensorView<const T>& w) {
  distributed::CallDescriptor mine;
  group.run([&] { mine = distributed::describe_call(options, q, v, w); });
  const size_t fields = distributed::call_fields();
  std::vector<int64_t> all(fields * size_t(group.size()));
  MPI_Allgather(mine.values.data(), int(fields), MPI_INT64_T, all.data(), int(fields), MPI_INT64_T,
                group.comm());
  group.traffic().control_bytes += int64_t(fields * sizeof(int64_t));
  std::vector<distributed::CallDescriptor> ranks(size_t(group.size()));
  std::vector<int64_t> tokens;
  for (size_t r = 0; r < ranks.size(); ++r) {
    ranks[r].values.assign(all.begin() + long(r * fields), all.begin() + long((r + 1) * fields));
    tokens.push_back(ranks[r].tokens());
  }
  // Each rank reaches the same verdict from the same data: no further exchange.
  if (const std::string problem = distributed::disagreement(ranks); !problem.empty())
    throw Error(std::string(group.fn()) + ": " + problem);
  Agreed a;
  try {
    a.shards = plan_shards(options.layout, tokens);
  } catch (const Error& e) {
    throw Error(std::string(group.fn()) + ": " + e.what());
  }
  a.local = options;
  a.local.layout = a.shards[size_t(group.rank())].layout;
  a.batch = mine.batch();
  a.heads = mine.heads();
  a.dk = mine.dk();
  a.dv = mine.dv();
  a.blocks = options.layout.num_blocks();
  a.masked = options.masking != Masking::none;
  for (int r = 0; r < group.size(); ++r)
    if (a.summary_size(r) > INT_MAX)
      throw Error(std::string(group.fn()) + ": rank " + std::to_string(r) + "'s summaries hold " +
                  std::to_string(a.summary_size(r)) +
                  " values, more than one MPI message can count (2^31 - 1)");
  return a;
}

// Copies M_r-block slices between a [B, H, M_r, E] tensor and the rows
// first_block.. of a [B, H, M, E] one.
template <typename T>
void copy_blocks(const Agreed& a, const Shard& s, const T* from, bool from_all, T* to) {
  const int64_t e = a.entry(), run = s.blocks * e;
  for (int64_t bh = 0; bh < a.batch * a.heads; ++bh) {
    const int64_t local = bh * run, all = (bh * a.blocks + s.first_block) * e;
    std::memcpy(to + (from_all ? local : all), from + (from_all ? all : local),
                size_t(run) * sizeof(T));
  }
}

// Phases 1 and 2 with the exchange between them: all_summaries [B, H, M, E]
// gets every block this rank reads (the rest stays zero), mixed [B, H, M_r, E]
// this rank's rows.
template <typename T>
void summarise_and_mix(RankAgreement& group, const Agreed& a, const TensorView<const T>& k,
                       const TensorView<const T>& v, const TensorView<const T>& w,
                       std::vector<T>& all_summaries, std::vector<T>& mixed) {
  const int me = group.rank(), ranks = group.size();
  const Shard& mine = a.shards[size_t(me)];
  std::vector<T> local(size_t(a.summary_size(me)));
  group.run([&] {
    block_summaries<T>(a.local, k, v, {local.data(), a.summary_shape(mine.blocks)});
  });
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

  all_summaries.assign(size_t(a.batch * a.heads * a.blocks * a.entry()), T(0));
  copy_blocks(a, mine, local.data(), false, all_summaries.data());
  for (int r = 0; r < ranks; ++r)
    if (receive[size_t(r)] > 0)
      copy_blocks(a, a.shards[size_t(r)], incoming.data() + receive_at[size_t(r)], false,
                  all_summaries.data());
  mixed.assign(size_t(a.summary_size(me)), T(0));
  group.run([&] {
    mix_summaries<T>(a.local, w, {all_summaries.data(), a.summary_shape(a.blocks)},
                     {mixed.data(), a.summary_shape(mine.blocks)}, mine.first_block);
  });
}

}  // namespace

ContextParallelTraffic& ContextParallelTraffic::operator+=(const ContextParallelTraffic& other) {
  summary_bytes_sent += other.summary_bytes_sent;
  summary_bytes_received += other.summary_bytes_received;
  reduction_bytes += other.reduction_bytes;
  control_bytes += other.control_bytes;
  return *this;
}

template <typename T>
void context_parallel_forward(MPI_Comm comm, const Options& options, TensorView<const T> q,
                              TensorView<const T> k, TensorView<const T> v, TensorView<const T> w,
                              TensorView<T> o, ContextParallelTraffic* traffic) {
  ContextParallelTraffic counted;
  RankAgreement group(comm, "mhla::context_parallel_forward", counted);
  const Agreed a = agree_on_call(group, options, q, v, w);
  const Shard& mine = a.shards[size_t(group.rank())];
  std::vector<T> all_summaries, mixed;
  summarise_and_mix(group, a, k, v, w, all_summaries, mixed);
  group.run([&] {
    read_out<T>(a.local, q, k, v, w, {mixed.data(), a.summary_shape(mine.blocks)}, o,
                mine.first_block);
  });
  if (traffic) *traffic += counted;
}

template <typename T>
void context_parallel_backward(MPI_Comm comm, const Options& options, TensorView<const T> q,
                               TensorView<const T> k, TensorView<const T> v, TensorView<const T> w,
                               TensorView<const T> o, TensorView<const T> grad_o,
                               TensorView<T> grad_q, TensorView<T> grad_k, TensorView<T> grad_v,
                               TensorView<T> grad_w, ContextParallelTraffic* traffic) {
  ContextParallelTraffic counted;
  RankAgreement group(comm, "mhla::context_parallel_backward", counted);
  const Agreed a = agree_on_call(group, options, q, v, w);
  const int me = group.rank(), ranks = group.size();
  const Shard& mine = a.shards[size_t(me)];
  // The forward's summaries and mix again: two all-to-alls of summaries per
  // step instead of keeping [B, H, M, E] per layer between the passes.
  std::vector<T> all_summaries, mixed;
  summarise_and_mix(group, a, k, v, w, all_summaries, mixed);

  const int64_t w_count = element_count(w.shape);
  std::vector<T> grad_mixed(mixed.size(), T(0)), grad_all(all_summaries.size(), T(0)),
      my_grad_w(size_t(w_count), T(0));
  group.run([&] {
    // The phases add to the gradients: checked here, then zeroed.
    const std::pair<const char*, const TensorView<T>*> outputs[] = {
        {"grad_q", &grad_q}, {"grad_k", &grad_k}, {"grad_v", &grad_v}, {"grad_w", &grad_w}};
    const std::vector<int64_t>* inputs[] = {&q.shape, &k.shape, &v.shape, &w.shape};
    for (size_t i = 0; i < 4; ++i) {
      const auto& [name, g] = outputs[i];
      if (g->shape != *inputs[i] || g->data == nullptr)
        throw Error(std::string(name) + " has shape " + shape_to_string(g->shape) +
                    (g->data ? "" : " and no data") + "; expected " + shape_to_string(*inputs[i]));
    }
    for (const TensorView<T>* g : {&grad_q, &grad_k, &grad_v})
      std::fill(g->data, g->data + element_count(g->shape), T(0));
    const std::vector<int64_t> mixed_shape = a.summary_shape(mine.blocks);
    read_out_backward<T>(a.local, q, k, v, w, {mixed.data(), mixed_shape}, o, grad_o, grad_q,
                         grad_k, grad_v, {grad_mixed.data(), mixed_shape},
                         {my_grad_w.data(), w.shape}, mine.first_block);
    mix_summaries_backward<T>(a.local, w, {all_summaries.data(), a.summary_shape(a.blocks)},
                              {grad_mixed.data(), mixed_shape},
                              {grad_all.data(), a.summary_shape(a.blocks)},
                              {my_grad_w.data(), w.shape}, mine.first_block);
  });

  // The summary gradients of the blocks this rank read go back to their owners.
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
    if (send[size_t(r)] > 0)
      copy_blocks(a, a.shards[size_t(r)], grad_all.data(), true,
                  outgoing.data() + send_at[size_t(r)]);
  MPI_Alltoallv(outgoing.data(), send.data(), send_at.data(), mpi_type<T>(), incoming.data(),
                receive.data(), receive_at.data(), mpi_type<T>(), group.comm());
  counted.summary_bytes_sent += sent * int64_t(sizeof(T));
  counted.summary_bytes_received += received * int64_t(sizeof(T));

  // Sum over the readers in rank order, this rank's own share at its place.
  std::vector<T> grad_summaries(size_t(a.summary_size(me)), T(0)), own(grad_summaries.size());
  copy_blocks(a, mine, grad_all.data(), true, own.data());
  for (int r = 0; r < ranks; ++r) {
    const T* part = r == me                  ? own.data()
                    : receive[size_t(r)] > 0 ? incoming.data() + receive_at[size_t(r)]
                                             : nullptr;
    if (part)
      for (size_t i = 0; i < grad_summaries.size(); ++i) grad_summaries[i] += part[i];
  }
  group.run([&] {
    block_summaries_backward<T>(
        a.local, k, v, {grad_summaries.data(), a.summary_shape(mine.blocks)}, grad_k, grad_v);
  });

  // grad_w: dense W's rows are disjoint between ranks (each adds only to the
  // rows of its own blocks), so a sum reduction is exact in any order. Toeplitz
  // w is shared by all rows: gathered and summed in rank order.
  counted.reduction_bytes += w_count * int64_t(sizeof(T));
  if (options.mixing == MixingForm::dense) {
    MPI_Allreduce(my_grad_w.data(), grad_w.data, int(w_count), mpi_type<T>(), MPI_SUM,
                  group.comm());
  } else {
    std::vector<T> gathered(size_t(w_count * ranks));
    MPI_Allgather(my_grad_w.data(), int(w_count), mpi_type<T>(), gathered.data(), int(w_count),
                  mpi_type<T>(), group.comm());
    std::fill(grad_w.data, grad_w.data + w_count, T(0));
    for (int r = 0; r < ranks; ++r)
      for (int64_t i = 0; i < w_count; ++i) grad_w.data[i] += gathered[size_t(r * w_count + i)];
  }
  if (traffic) *traffic += counted;
}

#define MHLA_INSTANTIATE_CONTEXT_PARALLEL(T)                                                       \
  template void context_parallel_forward<T>(                                                       \
      MPI_Comm, const Options&, TensorView<const T>, TensorView<const T>, TensorView<const T>,     \
      TensorView<const T>, TensorView<T>, ContextParallelTraffic*);                                \
  template void context_parallel_backward<T>(                                                      \
      MPI_Comm, const Options&, TensorView<const T>, TensorView<const T>, TensorView<const T>,     \
      TensorView<const T>, TensorView<const T>, TensorView<const T>, TensorView<T>, TensorView<T>, \
      TensorView<T>, TensorView<T>, ContextParallelTraffic*);
MHLA_INSTANTIATE_CONTEXT_PARALLEL(float)
MHLA_INSTANTIATE_CONTEXT_PARALLEL(double)
#undef MHLA_INSTANTIATE_CONTEXT_PARALLEL

}  // namespace mhla
