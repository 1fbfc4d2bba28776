#pragma once
// The summaries a rank mixes over, and the way their gradients go back.
//
// Dense W: every block a rank reads, as itself: an all-to-all sends each
// rank's summaries to the ranks that read them (all ranks without masking,
// only later ranks with it), and the gradients back to their owners.
//
// Toeplitz w (always masked): w[min(i - b, L)] weighs every block b at least
// L blocks before row i alike, so a rank whose first block is b0 needs the
// blocks b0 - L + 1 .. b0 - 1 individually and only the SUM of the blocks up
// to b0 - L. That sum comes from an exclusive prefix sum over the ranks, the
// window from the ranks that own it: what a rank receives no longer depends
// on M or the number of ranks, only on L.
//
// Either way the sources are [B, H, count, E] with this rank's own M_r
// blocks last, from index `first` (the row of W they are mixed as).
#include <vector>

#include "distributed/agreed_call.hpp"
#include "distributed/rank_agreement.hpp"

namespace mhla::distributed {

template <typename T>
struct Sources {
  std::vector<T> summaries;  // [B, H, count, Dk, Dv + 1]
  int64_t count = 0;
  int64_t first = 0;  // index of this rank's first block in `summaries`, and its row of W
};

// local: this rank's summaries [B, H, M_r, E].
template <typename T>
Sources<T> gather_sources(RankAgreement& group, const Agreed& a, const std::vector<T>& local);

// The gradient of sum(grad_sources * sources) over this rank's own blocks,
// [B, H, M_r, E]: its own share plus what the ranks that read them send back,
// added in rank order.
template <typename T>
std::vector<T> return_source_gradients(RankAgreement& group, const Agreed& a,
                                       const Sources<T>& sources,
                                       const std::vector<T>& grad_sources);

// The Toeplitz form (toeplitz_prefix.cpp).
template <typename T>
Sources<T> gather_toeplitz_prefix(RankAgreement& group, const Agreed& a,
                                  const std::vector<T>& local);
template <typename T>
std::vector<T> return_toeplitz_prefix_gradients(RankAgreement& group, const Agreed& a,
                                                const Sources<T>& sources,
                                                const std::vector<T>& grad_sources);

}  // namespace mhla::distributed
