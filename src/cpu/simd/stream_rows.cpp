// Highway compiles this file once per target instruction set (see
// block_gemm.cpp).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/simd/stream_rows.cpp"
#include <hwy/cache_control.h>
#include <hwy/foreach_target.h>  // must come before highway.h
#include <hwy/highway.h>

#include <cstring>

#include "cpu/simd/stream_rows.hpp"
#include "mhla/line_aligned.hpp"

HWY_BEFORE_NAMESPACE();
namespace mhla::cpu::simd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void StreamRowsImpl(const void* src, int64_t rows, int64_t lines, void* const* dst) {
  constexpr auto kLine = int64_t(mhla::detail::kCacheLine);
  constexpr int64_t kWordsPerLine = kLine / int64_t(sizeof(uint32_t));
  const hn::ScalableTag<uint32_t> d;
  const auto lanes = int64_t(hn::Lanes(d));
  const int64_t words = lines * kWordsPerLine;
  for (int64_t r = 0; r < rows; ++r) {
    const uint32_t* from = static_cast<const uint32_t*>(src) + r * words;
    int64_t i = 0;
    if (reinterpret_cast<uintptr_t>(dst[r]) % kLine == 0) {
      auto* to = static_cast<uint32_t*>(dst[r]);
      for (; i + lanes <= words; i += lanes) hn::Stream(hn::Load(d, from + i), d, to + i);
    }
    // The rest (all of a row off a line, which may be off a word too).
    std::memcpy(static_cast<char*>(dst[r]) + i * int64_t(sizeof(uint32_t)), from + i,
                size_t(words - i) * sizeof(uint32_t));
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace mhla::cpu::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mhla::cpu::simd {

HWY_EXPORT(StreamRowsImpl);

void stream_rows(const void* src, int64_t rows, int64_t lines, void* const* dst) {
  if (rows <= 0 || lines <= 0) return;
  HWY_DYNAMIC_DISPATCH(StreamRowsImpl)(src, rows, lines, dst);
}

void finish_streaming() { hwy::FlushStream(); }

}  // namespace mhla::cpu::simd
#endif  // HWY_ONCE
