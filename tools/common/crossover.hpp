#pragma once
// Where MHLA overtakes softmax attention in a sweep over N: the smallest
// measured N from which MHLA is faster at every larger measured N too, so
// that "faster from N on" holds for the whole table that prints it.
#include <cstdint>
#include <vector>

namespace mhla::tools {

struct SweepPoint {
  int64_t tokens = 0;
  double mhla_seconds = 0, softmax_seconds = 0;
};

// -1 when MHLA is not faster at the largest N (points in increasing N).
inline int64_t faster_from(const std::vector<SweepPoint>& points) {
  int64_t from = -1;
  for (auto p = points.rbegin(); p != points.rend() && p->mhla_seconds < p->softmax_seconds; ++p)
    from = p->tokens;
  return from;
}

}  // namespace mhla::tools
