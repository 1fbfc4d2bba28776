#pragma once
// Copying rows of whole cache lines with non-temporal (streaming) stores, as
// a SIMD kernel compiled for every x86 instruction set and chosen at run time
// like cpu/simd/block_gemm.hpp: on AVX-512 one store per line, which made
// mhla_bench's backward at its largest N faster than SSE2's 16-byte stores.
#include <cstdint>

namespace mhla::cpu::simd {

// Row r < rows of `lines` cache lines goes from src + r * lines * 64 (src
// starts on a line) to dst[r]. A dst[r] off a line is stored through the
// cache.
void stream_rows(const void* src, int64_t rows, int64_t lines, void* const* dst);

// Orders the calling thread's streamed stores before its later stores (they
// are weakly ordered), so that a parallel region's results are complete when
// it ends.
void finish_streaming();

}  // namespace mhla::cpu::simd
