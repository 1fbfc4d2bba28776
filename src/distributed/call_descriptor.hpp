#pragma once
// What every rank of a context-parallel call must agree on, as a fixed list of
// integers that one all-gather exchanges: the sizes B, H, Dk, Dv, the element
// type, every option, the whole sequence's layout, w's shape and a checksum of
// w's values. The token count N_r is the one entry that differs by rank.
#include <cstdint>
#include <string>
#include <vector>

#include "mhla/options.hpp"
#include "mhla/tensor.hpp"

namespace mhla::distributed {

struct CallDescriptor {
  std::vector<int64_t> values;  // kCallFields entries, in a fixed order
  int64_t batch() const;
  int64_t heads() const;
  int64_t dk() const;
  int64_t dv() const;
  int64_t tokens() const;
};

// How many values a descriptor holds (the same on every rank).
size_t call_fields();

// Reads the local call; throws mhla::Error if q or v is not rank 4 or w's
// shape cannot be read (so that the ranks settle that first).
template <typename T>
CallDescriptor describe_call(const Options& options, const TensorView<const T>& q,
                             const TensorView<const T>& v, const TensorView<const T>& w);

// The descriptors of all ranks (gathered, rank order); "" if they agree,
// else the first disagreement: "rank 2 disagrees with rank 0 on masking:
// causal vs none".
std::string disagreement(const std::vector<CallDescriptor>& ranks);

}  // namespace mhla::distributed
