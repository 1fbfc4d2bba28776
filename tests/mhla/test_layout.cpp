#include "test_support.hpp"

namespace mhla::test {
namespace {

// Every token belongs to exactly one block, for_each_run and block_of agree,
// and block sizes add up to N.
void check_partition(const TokenLayout& layout) {
  std::vector<int> seen(layout.num_tokens(), 0);
  int64_t total = 0;
  for (int64_t b = 0; b < layout.num_blocks(); ++b) {
    int64_t size = 0;
    layout.for_each_run(b, [&](int64_t first, int64_t len) {
      ASSERT_GT(len, 0);
      for (int64_t t = first; t < first + len; ++t) {
        ASSERT_LT(t, layout.num_tokens());
        ++seen[t];
        EXPECT_EQ(layout.block_of(t), b) << "token " << t;
      }
      size += len;
    });
    EXPECT_EQ(size, layout.block_size(b));
    EXPECT_LE(size, layout.max_block_size());
    total += size;
  }
  EXPECT_EQ(total, layout.num_tokens());
  for (int count : seen) EXPECT_EQ(count, 1);
}

TEST(TokenLayout, PartitionsTokens) {
  for (const auto& layout :
       {TokenLayout::sequence(1, 1), TokenLayout::sequence(37, 8), TokenLayout::sequence(10, 100),
        TokenLayout::grid2d(7, 5, 3, 2), TokenLayout::grid2d(14, 14, 7, 7),
        TokenLayout::grid3d(3, 5, 4, 2, 2, 3), TokenLayout::grid3d(21, 30, 50, 3, 5, 10)})
    check_partition(layout);
}

TEST(TokenLayout, CountsBlocksRowMajorWithRaggedEdges) {
  const TokenLayout l = TokenLayout::grid2d(7, 5, 3, 2);
  EXPECT_EQ(l.num_blocks(), 3 * 3);
  EXPECT_EQ(l.block_size(0), 6);  // full 3x2 tile
  EXPECT_EQ(l.block_size(2), 3);  // 3x1 ragged right edge
  EXPECT_EQ(l.block_size(8), 1);  // 1x1 corner
  // Token (row 3, col 4) = 19 lies in block row 1, block column 2.
  EXPECT_EQ(l.block_of(3 * 5 + 4), 1 * 3 + 2);
  const TokenLayout v = TokenLayout::grid3d(21, 30, 50, 3, 5, 10);  // the paper's video shape
  EXPECT_EQ(v.num_tokens(), 31500);
  EXPECT_EQ(v.num_blocks(), 7 * 6 * 5);
  EXPECT_EQ(TokenLayout::sequence(4096, 64).num_blocks(), 64);
  EXPECT_EQ(TokenLayout::sequence(4097, 64).num_blocks(), 65);
}

TEST(TokenLayout, RejectsNonPositiveAndOverflowingSizes) {
  EXPECT_THROW(TokenLayout::sequence(0, 4), Error);
  EXPECT_THROW(TokenLayout::sequence(8, 0), Error);
  EXPECT_THROW(TokenLayout::grid2d(4, -1, 2, 2), Error);
  try {
    TokenLayout::grid3d(1 << 30, 1 << 30, 1 << 30, 1, 1, 1);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "TokenLayout: number of tokens overflows 64-bit byte counts");
  }
  try {
    TokenLayout::sequence(8, -3);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tile extent W must be positive, got -3"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace mhla::test
