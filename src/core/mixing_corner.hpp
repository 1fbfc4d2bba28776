#pragma once
// A shorter sequence reads the top-left corner of a dense mixing matrix: the
// decoder's prefill and every sequence of a packed batch.
#include <algorithm>
#include <cstdint>
#include <vector>

namespace mhla::detail {

// The top-left m x m corner of each of `copies` row-major [big, big] matrices.
template <typename T>
std::vector<T> mixing_corner(const T* w, int64_t copies, int64_t big, int64_t m) {
  std::vector<T> corner(size_t(copies * m * m));
  for (int64_t c = 0; c < copies; ++c)
    for (int64_t i = 0; i < m; ++i)
      std::copy_n(w + (c * big + i) * big, m, corner.data() + (c * m + i) * m);
  return corner;
}

}  // namespace mhla::detail
