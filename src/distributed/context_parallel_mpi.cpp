// Context-parallel forward and backward over MPI, built on the public phase
// functions (mhla/phases.hpp). See mhla/context_parallel_mpi.hpp; the
// exchanges are in summary_exchange.hpp.
#include "mhla/context_parallel_mpi.hpp"

#include <algorithm>
#include <utility>
#include <vector>

#include "distributed/agreed_call.hpp"
#include "distributed/rank_agreement.hpp"
#include "distributed/summary_exchange.hpp"
#include "mhla/error.hpp"
#include "mhla/phases.hpp"
#include "mhla_support/checked_math.hpp"

namespace mhla {
namespace {

using distributed::Agreed;
using distributed::mpi_type;
using distributed::RankAgreement;
using distributed::Sources;

// Phases 1 and 2 with the exchange between them: the sources this rank
// mixes over, and its mixed summaries [B, H, M_r, E].
template <typename T>
Sources<T> summarise_and_mix(RankAgreement& group, const Agreed& a, const TensorView<const T>& k,
                             const TensorView<const T>& v, const TensorView<const T>& w,
                             std::vector<T>& mixed) {
  const Shard& mine = a.mine();
  std::vector<T> local(size_t(a.summary_size(a.rank)));
  group.run([&] {
    block_summaries<T>(a.local, k, v, {local.data(), a.summary_shape(mine.blocks)});
  });
  Sources<T> sources = distributed::gather_sources(group, a, local);
  mixed.assign(local.size(), T(0));
  group.run([&] {
    mix_summaries<T>(a.local, w, {sources.summaries.data(), a.summary_shape(sources.count)},
                     {mixed.data(), a.summary_shape(mine.blocks)}, sources.first);
  });
  return sources;
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
  const Agreed a = distributed::agree_on_call(group, options, q, v, w);
  const Shard& mine = a.mine();
  std::vector<T> mixed;
  const Sources<T> sources = summarise_and_mix(group, a, k, v, w, mixed);
  group.run([&] {
    read_out<T>(a.local, q, k, v, w, {mixed.data(), a.summary_shape(mine.blocks)}, o,
                sources.first);
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
  const Agreed a = distributed::agree_on_call(group, options, q, v, w);
  const int ranks = group.size();
  const Shard& mine = a.mine();
  // The forward's summaries and mix again: the exchange runs twice per step
  // instead of keeping the sources per layer between the passes.
  std::vector<T> mixed;
  const Sources<T> sources = summarise_and_mix(group, a, k, v, w, mixed);

  const int64_t w_count = detail::checked_product(w.shape, "w");
  std::vector<T> grad_mixed(mixed.size(), T(0)), grad_sources(sources.summaries.size(), T(0)),
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
      std::fill(g->data, g->data + detail::checked_product(g->shape, "a gradient"), T(0));
    const std::vector<int64_t> mixed_shape = a.summary_shape(mine.blocks);
    read_out_backward<T>(a.local, q, k, v, w, {mixed.data(), mixed_shape}, o, grad_o, grad_q,
                         grad_k, grad_v, {grad_mixed.data(), mixed_shape},
                         {my_grad_w.data(), w.shape}, sources.first);
    const std::vector<int64_t> sources_shape = a.summary_shape(sources.count);
    mix_summaries_backward<T>(
        a.local, w, {sources.summaries.data(), sources_shape}, {grad_mixed.data(), mixed_shape},
        {grad_sources.data(), sources_shape}, {my_grad_w.data(), w.shape}, sources.first);
  });

  // Each block's summary gradient: this rank's share and the readers'.
  const std::vector<T> grad_summaries =
      distributed::return_source_gradients(group, a, sources, grad_sources);

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
