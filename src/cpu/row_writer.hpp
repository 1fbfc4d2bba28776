#pragma once
// How a kernel writes the rows of a [B, N, H, width] result: replacing them or
// adding to them through the cache, or, for a final result as large as the
// last-level cache, replacing them with non-temporal (streaming) stores.
//
// Such a result is not read again while the kernel runs. Written through the
// cache, each of its lines is first read from memory (the write's ownership
// request) and later evicted by the lines that follow; streamed, it goes to
// memory once, and the rows the kernels request ahead arrive sooner
// (mhla_bench's backward at its largest N, whose gradients are four times
// the last-level cache). Below the threshold rows stay in the cache, where
// the caller's next operation finds them.
//
// Only rows of whole cache lines that start on a line are streamed (a partial
// line would reach memory in pieces): rows are formed in a line-aligned
// buffer, then copied out by the streaming kernel (cpu/simd/stream_rows.hpp).
#include <cstdint>

#include "core/validate.hpp"
#include "cpu/simd/stream_rows.hpp"
#include "mhla/line_aligned.hpp"

namespace mhla::cpu {

enum class RowWrite { overwrite, accumulate, stream };

// Results of at least this many bytes are streamed: the last-level cache of
// the machines measured (32 MiB; one cache, not the sum of all of them, is
// what a core can keep); at that size streaming gained nothing in mhla_bench.
inline constexpr int64_t kStreamedResultBytes = int64_t(32) << 20;

// How a kernel writes its [B, N, H, width] result of S, unless it adds to it:
// streamed when the result is as large as the cache, its rows whole lines and
// its first row on a line (then all are: rows are whole lines apart).
template <typename S>
RowWrite result_write(const mhla::detail::AttentionDims& d, int64_t width, const S* result,
                      bool accumulate = false) {
  if (accumulate) return RowWrite::accumulate;
  const auto line = int64_t(mhla::detail::kCacheLine);
  const int64_t row_bytes = width * int64_t(sizeof(S));
  const bool streams = row_bytes % line == 0 &&
                       reinterpret_cast<uintptr_t>(result) % uintptr_t(line) == 0 &&
                       d.batch * d.tokens * d.heads * row_bytes >= kStreamedResultBytes;
  return streams ? RowWrite::stream : RowWrite::overwrite;
}

// One thread's writes of one result during a kernel's parallel loop (made
// inside the parallel region, before the loop). The row bound for `out` is
// formed at target(out), in full before the next call: `out` itself, or
// streaming, a row of the writer's buffer, streamed out a few rows at a time
// (one call of the SIMD kernel per group; rows formed in a block-sized tile
// and streamed block by block left it in L1 less, and the backward slower).
// Streamed stores are weakly ordered, so the destructor fences
// them, once per region (a fence per block would wait on each block's stores).
template <typename T>
class RowWriter {
 public:
  RowWriter(RowWrite mode, int64_t width) : mode_(mode), width_(width) {
    if (streaming()) buffer_.resize(size_t(kGroup * width));
  }
  RowWriter(const RowWriter&) = delete;
  RowWriter& operator=(const RowWriter&) = delete;
  ~RowWriter() {
    if (!streaming()) return;
    flush();
    simd::finish_streaming();
  }

  bool accumulating() const { return mode_ == RowWrite::accumulate; }
  // Streamed rows need no lines requested ahead.
  bool streaming() const { return mode_ == RowWrite::stream; }

  T* target(T* out) {
    if (!streaming()) return out;
    if (pending_ == kGroup) flush();
    dst_[pending_] = out;
    return buffer_.data() + pending_++ * width_;
  }

 private:
  static constexpr int64_t kGroup = 8;

  void flush() {
    simd::stream_rows(buffer_.data(), pending_,
                      width_ * int64_t(sizeof(T)) / int64_t(mhla::detail::kCacheLine), dst_);
    pending_ = 0;
  }

  RowWrite mode_;
  int64_t width_;
  mhla::detail::LineAlignedVector<T> buffer_;
  void* dst_[kGroup] = {};
  int64_t pending_ = 0;
};

}  // namespace mhla::cpu
