// Streamed result rows (cpu/row_writer.hpp, cpu/simd/stream_rows.hpp) on every
// instruction set this CPU runs: the streaming kernel copies rows exactly and
// nothing beside them, stores rows off a cache line through the cache, and a
// streaming RowWriter leaves the same bits as one writing in place, for rows
// in whole groups and a last partial group; and which results stream.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "cpu/row_writer.hpp"
#include "cpu/simd/isa.hpp"
#include "cpu/simd/stream_rows.hpp"
#include "mhla/bfloat16.hpp"
#include "mhla/line_aligned.hpp"

namespace {

using mhla::cpu::RowWrite;
using mhla::cpu::RowWriter;
using mhla::detail::LineAlignedVector;

class StreamRowsKernel : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override { mhla::cpu::simd::pin_target(GetParam()); }
  void TearDown() override { mhla::cpu::simd::pin_target(0); }
};

std::vector<uint32_t> random_words(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<uint32_t> words(n);
  for (auto& w : words) w = uint32_t(rng());
  return words;
}

TEST_P(StreamRowsKernel, CopiesRowsAndNothingBeside) {
  constexpr int64_t kWordsPerLine = 16;
  for (int64_t lines : {1, 2, 3, 5}) {
    for (int64_t offset_words : {0, 1, 4}) {  // rows on a line, and off one
      SCOPED_TRACE(::testing::Message() << lines << " lines, dst offset " << offset_words);
      const int64_t rows = 7, words = lines * kWordsPerLine, pitch = words + 2 * kWordsPerLine;
      const std::vector<uint32_t> values = random_words(size_t(rows * words), 3);
      LineAlignedVector<uint32_t> src(values.begin(), values.end());
      LineAlignedVector<uint32_t> dst(size_t(rows * pitch + 2 * kWordsPerLine), 0xdeadbeefu);
      std::vector<void*> rows_dst;
      for (int64_t r = 0; r < rows; ++r) rows_dst.push_back(dst.data() + r * pitch + offset_words);
      mhla::cpu::simd::stream_rows(src.data(), rows, lines, rows_dst.data());
      mhla::cpu::simd::finish_streaming();
      for (int64_t i = 0; i < int64_t(dst.size()); ++i) {
        const int64_t r = (i - offset_words) / pitch, e = (i - offset_words) % pitch;
        const bool in_row = i >= offset_words && r < rows && e < words;
        ASSERT_EQ(dst[size_t(i)], in_row ? values[size_t(r * words + e)] : 0xdeadbeefu)
            << "word " << i;
      }
    }
  }
}

// A result's rows, H = 3 rows of `width` apart per token, through a
// RowWriter: streamed and in place give the same bits, the last partial group
// of rows included (written when the writer ends).
template <typename T>
std::vector<T> write_through(RowWrite mode, int64_t tokens, int64_t width, bool offset_by_one) {
  constexpr int64_t kHeads = 3;
  LineAlignedVector<T> dst(size_t(tokens * kHeads * width + 1), T(0));
  T* base = dst.data() + (offset_by_one ? 1 : 0);
  {
    RowWriter<T> writer(mode, width);
    for (int64_t t = 0; t < tokens; ++t) {
      T* row = writer.target(base + (t * kHeads + 1) * width);
      for (int64_t e = 0; e < width; ++e) row[e] = T(float(t * 1000 + e) * 0.5f);
    }
  }
  return std::vector<T>(dst.begin(), dst.end());
}

TEST_P(StreamRowsKernel, StreamingWriterMatchesWritingInPlace) {
  for (int64_t tokens : {1, 8, 19}) {
    for (bool offset : {false, true}) {
      SCOPED_TRACE(::testing::Message() << tokens << " tokens, offset " << offset);
      EXPECT_EQ(write_through<float>(RowWrite::stream, tokens, 48, offset),
                write_through<float>(RowWrite::overwrite, tokens, 48, offset));
      const auto bits = [](const std::vector<mhla::bfloat16>& x) {
        std::vector<uint16_t> b;
        for (auto v : x) b.push_back(v.bits);
        return b;
      };
      EXPECT_EQ(bits(write_through<mhla::bfloat16>(RowWrite::stream, tokens, 64, offset)),
                bits(write_through<mhla::bfloat16>(RowWrite::overwrite, tokens, 64, offset)));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryTarget, StreamRowsKernel,
                         ::testing::ValuesIn(mhla::cpu::simd::runnable_targets()),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return mhla::cpu::simd::target_name(info.param);
                         });

TEST(ResultWrite, StreamsOnlyLargeLineAlignedResultsOfWholeLines) {
  const LineAlignedVector<float> buffer(32);
  const float* aligned = buffer.data();
  // B * N * H rows of 64 floats (256 bytes): 2^17 rows are 32 MiB.
  const mhla::detail::AttentionDims large{1, int64_t(1) << 17, 1, 64, 64};
  const mhla::detail::AttentionDims small{1, (int64_t(1) << 17) - 1, 1, 64, 64};
  EXPECT_EQ(mhla::cpu::result_write(large, 64, aligned), RowWrite::stream);
  EXPECT_EQ(mhla::cpu::result_write(small, 64, aligned), RowWrite::overwrite);
  EXPECT_EQ(mhla::cpu::result_write(large, 64, aligned + 1), RowWrite::overwrite);  // off a line
  EXPECT_EQ(mhla::cpu::result_write(large, 60, aligned), RowWrite::overwrite);      // 240-byte rows
  EXPECT_EQ(mhla::cpu::result_write(large, 64, aligned, true), RowWrite::accumulate);
}

}  // namespace
