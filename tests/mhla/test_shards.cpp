// How ranks share a sequence (mhla/shards.hpp): token and block ranges, the
// shards' own layouts, and named errors for cuts the operator cannot split at.
#include "test_support.hpp"

namespace mhla::test {
namespace {

using testing::HasSubstr;

std::string error_of(const TokenLayout& layout, const std::vector<int64_t>& tokens) {
  try {
    plan_shards(layout, tokens);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Shards, A1DSequenceIsCutBetweenBlocksWithTheRaggedEdgeLast) {
  const std::vector<Shard> s = plan_shards(TokenLayout::sequence(37, 8), {8, 24, 5});
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].first_token, 0);
  EXPECT_EQ(s[1].first_token, 8);
  EXPECT_EQ(s[2].first_token, 32);
  EXPECT_EQ(s[1].first_block, 1);
  EXPECT_EQ(s[1].blocks, 3);
  EXPECT_EQ(s[2].first_block, 4);
  EXPECT_EQ(s[2].blocks, 1);
  EXPECT_EQ(s[1].layout, TokenLayout::sequence(24, 8));
  EXPECT_EQ(s[2].layout, TokenLayout::sequence(5, 8));
}

TEST(Shards, GridsAreCutAlongTheirFirstAxisAtTileBoundaries) {
  // 7 x 5 tokens in 3 x 2 tiles: 3 tile rows of 3 blocks each.
  const std::vector<Shard> s2 = plan_shards(TokenLayout::grid2d(7, 5, 3, 2), {15, 20});
  EXPECT_EQ(s2[1].first_token, 15);
  EXPECT_EQ(s2[1].first_block, 3);
  EXPECT_EQ(s2[1].blocks, 6);
  EXPECT_EQ(s2[1].layout, TokenLayout::grid2d(4, 5, 3, 2));
  // 3 frames of 5 x 4 in 2 x 2 x 3 tiles: 2 frame tiles of 3 x 2 blocks each.
  const std::vector<Shard> s3 = plan_shards(TokenLayout::grid3d(3, 5, 4, 2, 2, 3), {40, 20});
  EXPECT_EQ(s3[1].first_block, 6);
  EXPECT_EQ(s3[1].blocks, 6);
  EXPECT_EQ(s3[1].layout, TokenLayout::grid3d(1, 5, 4, 2, 2, 3));
}

TEST(Shards, CutsTheOperatorCannotSplitAtAreNamedWithTheRank) {
  EXPECT_THAT(error_of(TokenLayout::sequence(16, 4), {6, 10}),
              HasSubstr("rank 0 holds tokens 0..5, which ends inside block 1"));
  EXPECT_THAT(error_of(TokenLayout::sequence(16, 4), {16, 0}),
              HasSubstr("rank 1 holds 0 tokens; every rank needs at least one block"));
  EXPECT_THAT(error_of(TokenLayout::sequence(16, 4), {8, 4}),
              HasSubstr("the ranks hold 12 tokens in all, but the layout"));
  EXPECT_THAT(error_of(TokenLayout::grid2d(6, 5, 3, 5), {12, 18}),
              HasSubstr("rank 0 holds 12 tokens, not whole grid rows of 5 tokens"));
  EXPECT_THAT(error_of(TokenLayout::grid2d(6, 5, 3, 5), {10, 20}),
              HasSubstr("rank 0 holds tokens 0..9, which ends inside block 0"));
}

TEST(Shards, MaskedRanksReadOnlyEarlierRanks) {
  EXPECT_TRUE(reads_blocks_of(false, 0, 2));
  EXPECT_TRUE(reads_blocks_of(true, 2, 0));
  EXPECT_TRUE(reads_blocks_of(true, 1, 1));
  EXPECT_FALSE(reads_blocks_of(true, 0, 2));
}

}  // namespace
}  // namespace mhla::test
