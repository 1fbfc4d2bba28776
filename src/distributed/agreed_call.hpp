#pragma once
// What the ranks of a context-parallel call agreed on before any exchange:
// the shards, this rank's options (its own layout), the summary sizes.
#include <mpi.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "distributed/rank_agreement.hpp"
#include "mhla/options.hpp"
#include "mhla/shards.hpp"
#include "mhla/tensor.hpp"

namespace mhla::distributed {

template <typename T>
MPI_Datatype mpi_type() {
  return sizeof(T) == 4 ? MPI_FLOAT : MPI_DOUBLE;
}

struct Agreed {
  std::vector<Shard> shards;
  Options local;
  int rank = 0;
  int64_t batch = 0, heads = 0, dk = 0, dv = 0, blocks = 0;
  int64_t toeplitz_length = -1;  // L of Toeplitz w; -1 for dense W
  bool masked = false;

  const Shard& mine() const { return shards[size_t(rank)]; }
  int64_t slices() const { return batch * heads; }
  int64_t entry() const { return dk * (dv + 1); }  // one block's summary, per (b, h)
  int64_t summary_size(int r) const { return slices() * shards[size_t(r)].blocks * entry(); }
  std::vector<int64_t> summary_shape(int64_t m) const { return {batch, heads, m, dk, dv + 1}; }

  // Copies `count` blocks of every (b, h) slice from block `from_block` of a
  // [B, H, from_blocks, E] tensor to block `to_block` of a [B, H, to_blocks, E] one.
  template <typename T>
  void copy_blocks(const T* from, int64_t from_blocks, int64_t from_block, T* to, int64_t to_blocks,
                   int64_t to_block, int64_t count) const {
    const int64_t e = entry();
    for (int64_t s = 0; s < slices(); ++s)
      std::memcpy(to + (s * to_blocks + to_block) * e, from + (s * from_blocks + from_block) * e,
                  size_t(count * e) * sizeof(T));
  }
};

// Every rank checks its own call, then the ranks compare their calls and
// agree on the shards; a problem anywhere is the same mhla::Error on every
// rank. Afterwards all ranks run the same collectives.
template <typename T>
Agreed agree_on_call(RankAgreement& group, const Options& options, const TensorView<const T>& q,
                     const TensorView<const T>& v, const TensorView<const T>& w);

}  // namespace mhla::distributed
