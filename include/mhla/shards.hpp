#pragma once
// How the ranks of a context-parallel group share one sequence: rank r holds a
// contiguous range of whole blocks. A 1D sequence is cut between blocks; a 2D
// or 3D grid is cut along its first axis (rows of tiles, frames of tiles) at
// tile boundaries, so that each shard is a contiguous range of token indices
// and of block indices (blocks are numbered row-major over the tiles). Only
// the last rank's shard may end in a ragged edge block.
//
// Used by the MPI layer (mhla/context_parallel_mpi.hpp) and the Python
// torch.distributed layer alike; needs no communication library.
#include <cstdint>
#include <vector>

#include "mhla/layout.hpp"

namespace mhla {

struct Shard {
  int64_t first_token = 0, tokens = 0;  // token range [first_token, first_token + tokens)
  int64_t first_block = 0, blocks = 0;  // its blocks: rows first_block.. of W
  TokenLayout layout;                   // the shard's own blocks, as a layout of `tokens`
};

// The shards of ranks 0..R-1 holding tokens_per_rank[r] tokens each, in rank
// order. Throws mhla::Error naming the rank and the problem: a rank with no
// tokens, a shard that is not whole grid rows or does not end at a block
// boundary, token counts that do not add up to the layout's.
std::vector<Shard> plan_shards(const TokenLayout& layout,
                               const std::vector<int64_t>& tokens_per_rank);

// Does rank `reader` read the summaries of rank `owner`'s blocks? Every other
// rank's without masking; only earlier ranks' (and its own) with causal or
// block-causal masking, whose query blocks read no later block.
bool reads_blocks_of(bool masked, int reader, int owner);

}  // namespace mhla
