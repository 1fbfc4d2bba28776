#include "distributed/agreed_call.hpp"

#include <climits>
#include <string>

#include "distributed/call_descriptor.hpp"
#include "mhla/error.hpp"

namespace mhla::distributed {

template <typename T>
Agreed agree_on_call(RankAgreement& group, const Options& options, const TensorView<const T>& q,
                     const TensorView<const T>& v, const TensorView<const T>& w) {
  CallDescriptor mine;
  group.run([&] { mine = describe_call(options, q, v, w); });
  const size_t fields = call_fields();
  std::vector<int64_t> all(fields * size_t(group.size()));
  MPI_Allgather(mine.values.data(), int(fields), MPI_INT64_T, all.data(), int(fields), MPI_INT64_T,
                group.comm());
  group.traffic().control_bytes += int64_t(fields * sizeof(int64_t));
  std::vector<CallDescriptor> ranks(size_t(group.size()));
  std::vector<int64_t> tokens;
  for (size_t r = 0; r < ranks.size(); ++r) {
    ranks[r].values.assign(all.begin() + long(r * fields), all.begin() + long((r + 1) * fields));
    tokens.push_back(ranks[r].tokens());
  }
  // Each rank reaches the same verdict from the same data: no further exchange.
  if (const std::string problem = disagreement(ranks); !problem.empty())
    throw Error(std::string(group.fn()) + ": " + problem);
  Agreed a;
  a.rank = group.rank();
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
  if (options.mixing == MixingForm::toeplitz) a.toeplitz_length = w.shape.back() - 1;
  for (int r = 0; r < group.size(); ++r)
    if (a.summary_size(r) > INT_MAX)
      throw Error(std::string(group.fn()) + ": rank " + std::to_string(r) + "'s summaries hold " +
                  std::to_string(a.summary_size(r)) +
                  " values, more than one MPI message can count (2^31 - 1)");
  return a;
}

template Agreed agree_on_call<float>(RankAgreement&, const Options&, const TensorView<const float>&,
                                     const TensorView<const float>&,
                                     const TensorView<const float>&);
template Agreed agree_on_call<double>(RankAgreement&, const Options&,
                                      const TensorView<const double>&,
                                      const TensorView<const double>&,
                                      const TensorView<const double>&);

}  // namespace mhla::distributed
