#pragma once
// Walks the cache lines of a LineRuns, one request per call: the products
// call Next() once per step of their inner dimension.
#include <cstdint>

#include "cpu/simd/block_gemm.hpp"

namespace mhla::cpu::simd {

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
