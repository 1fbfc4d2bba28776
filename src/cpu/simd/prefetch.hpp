#pragma once
// Software prefetching for the kernels: rows a few tokens ahead, and the
// cursor that walks the cache lines of a LineRuns, one request per call (the
// products call Next() once per step of their inner dimension).
#include <cstdint>

#include "cpu/simd/block_gemm.hpp"

namespace mhla::cpu::simd {

// Rows of one head are H * D elements apart, a stride the hardware prefetcher
// follows poorly; fetching the row 8 tokens ahead made mhla_bench's forward
// faster. Prefetches never fault, so running past the
// block or the tensor is harmless (the address is formed as an integer).
template <typename T>
inline void prefetch_ahead(const T* row, int64_t stride, int64_t width) {
  constexpr int64_t kTokensAhead = 8, kLine = 64;
  const uintptr_t ahead = reinterpret_cast<uintptr_t>(row) + kTokensAhead * stride * sizeof(T);
  for (int64_t byte = 0; byte < width * int64_t(sizeof(T)); byte += kLine)
    __builtin_prefetch(reinterpret_cast<const void*>(ahead + uintptr_t(byte)));
}

class PrefetchCursor {
 public:
  explicit PrefetchCursor(LineRuns runs) : runs_(runs) {}

  __attribute__((always_inline)) inline void Next() {
    if (run_ >= runs_.count) return;
    const LineRuns::Run& r = runs_.runs[run_];
    const char* line = r.first + row_ * r.stride + line_ * 64;
    if (r.write)
      __builtin_prefetch(line, 1, 3);
    else
      __builtin_prefetch(line, 0, 3);
    if (++line_ < r.lines) return;
    line_ = 0;
    if (++row_ < r.rows) return;
    row_ = 0;
    ++run_;
  }

 private:
  LineRuns runs_;
  int64_t run_ = 0, row_ = 0, line_ = 0;
};

}  // namespace mhla::cpu::simd
