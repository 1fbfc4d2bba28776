#pragma once
// How the one-thread-per-element kernels are launched: blocks of kThreads, a
// grid that covers the elements (capped: the kernels stride over the rest).
#include <cstdint>

namespace mhla::cuda {

inline constexpr int kThreads = 256;

inline int grid_for(int64_t total) {
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  constexpr int64_t kMaxBlocks = int64_t(1) << 30;
  return int(blocks < kMaxBlocks ? (blocks > 0 ? blocks : 1) : kMaxBlocks);
}

// for (i over [0, total)) in a grid-stride loop
#define MHLA_GRID_STRIDE(i, total)                                              \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (total); \
       i += int64_t(gridDim.x) * blockDim.x)

}  // namespace mhla::cuda
