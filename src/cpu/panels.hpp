#pragma once
// Fixed work decomposition of the [B*H, M, X] summary arrays for the mixers.
// The panels do not depend on the thread count, so every reduction inside a
// panel runs in the same order whatever the threads: results are bit-identical.
#include <algorithm>
#include <cstdint>

namespace mhla::cpu {

// Column panel width of the [M, X] summary matrices: wide enough for an
// efficient GEMM (M x 1024 x M), narrow enough to give two threads work at B*H = 1.
constexpr int64_t kPanel = 1024;

inline int64_t count_panels(int64_t extent, int64_t width) { return (extent + width - 1) / width; }

// Runs fn(task, slice, first_column, columns) for every (slice, column panel)
// pair, in parallel: columns of the [M, X] summary matrices are independent.
// task = slice * count_panels(x, kPanel) + panel.
template <typename Fn>
void for_each_panel(int64_t slices, int64_t x, Fn&& fn) {
  const int64_t panels = count_panels(x, kPanel);
#pragma omp parallel for schedule(static)
  for (int64_t task = 0; task < slices * panels; ++task) {
    const int64_t c0 = (task % panels) * kPanel;
    fn(task, task / panels, c0, std::min(kPanel, x - c0));
  }
}

}  // namespace mhla::cpu
