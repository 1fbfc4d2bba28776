// The MQAR generator against Zoology's definition, and the Fashion-MNIST reader.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <map>
#include <set>

#include "mhla/error.hpp"
#include "train/fashion_mnist.hpp"
#include "train/mqar.hpp"

namespace mhla::train {
namespace {

using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

TEST(TrainData, MqarSequencesFollowTheDefinition) {
  const MqarConfig c{64, 96, 8, 0.01};
  const Batch b = make_mqar_batch(c, 20, 1);
  ASSERT_EQ(b.tokens.size(), size_t(20 * 96));
  for (int64_t s = 0; s < 20; ++s) {
    const int32_t* t = b.tokens.data() + s * 96;
    const int32_t* y = b.targets.data() + s * 96;
    std::map<int32_t, int32_t> value_of;
    for (int p = 0; p < 8; ++p) {
      EXPECT_GE(t[2 * p], 1);
      EXPECT_LT(t[2 * p], 32);      // keys: lower half
      EXPECT_GE(t[2 * p + 1], 32);  // values: upper half
      EXPECT_TRUE(value_of.emplace(t[2 * p], t[2 * p + 1]).second) << "keys are distinct";
    }
    std::set<int32_t> queried;
    for (int64_t i = 0; i < 96; ++i) {
      EXPECT_GE(t[i], 0);
      EXPECT_LT(t[i], 64);
      if (y[i] < 0) continue;
      EXPECT_GE(i, 16) << "queries follow the context";
      EXPECT_EQ((i - 16) % 2, 0);
      ASSERT_TRUE(value_of.count(t[i])) << "a query is a context key";
      EXPECT_EQ(y[i], value_of[t[i]]) << "its target is the paired value";
      queried.insert(t[i]);
    }
    EXPECT_EQ(queried.size(), 8u) << "every key is queried once";
  }
}

TEST(TrainData, MqarIsAFunctionOfTheSeed) {
  const MqarConfig c{64, 64, 4, 0.01};
  EXPECT_EQ(make_mqar_batch(c, 3, 7).tokens, make_mqar_batch(c, 3, 7).tokens);
  EXPECT_NE(make_mqar_batch(c, 3, 7).tokens, make_mqar_batch(c, 3, 8).tokens);
  EXPECT_NE(stream_seed(1, 2), stream_seed(2, 1));
}

TEST(TrainData, MqarQueriesClusterNearTheContext) {
  // Zoology's power law puts most queries in the first slots after the context.
  const MqarConfig c{256, 512, 4, 0.01};
  const Batch b = make_mqar_batch(c, 200, 3);
  int64_t early = 0, total = 0;
  for (size_t i = 0; i < b.targets.size(); ++i)
    if (b.targets[i] >= 0) {
      ++total;
      early += int64_t(i % 512) < 8 + 2 * 50;
    }
  EXPECT_EQ(total, 800);
  // p(slot g) ~ g^-0.99: the first 50 of 252 slots hold about 3/4 of the queries
  // (uniform slots would give 20%).
  EXPECT_GT(early, total * 6 / 10);
  EXPECT_LT(early, total);
}

TEST(TrainData, MqarRejectsImpossibleSettings) {
  EXPECT_THAT(
      [] {
        make_mqar_batch({16, 256, 16, 0.01}, 1, 0);
      },
      ThrowsMessage<Error>(HasSubstr("vocabulary")));
  EXPECT_THAT(
      [] {
        make_mqar_batch({256, 32, 16, 0.01}, 1, 0);
      },
      ThrowsMessage<Error>(HasSubstr("seq_len >= 64")));
}

void write_gzip(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  gzwrite(f, bytes.data(), unsigned(bytes.size()));
  gzclose(f);
}

std::vector<uint8_t> idx(uint32_t magic, std::vector<uint32_t> dims, size_t payload, uint8_t fill) {
  std::vector<uint8_t> b;
  for (uint32_t v : std::vector<uint32_t>{magic}) dims.insert(dims.begin(), v);
  for (uint32_t v : dims)
    for (int s = 24; s >= 0; s -= 8) b.push_back(uint8_t(v >> s));
  b.insert(b.end(), payload, fill);
  return b;
}

TEST(TrainData, FashionMnistReaderAndPatches) {
  const std::string dir = (std::filesystem::temp_directory_path() / "mhla_fmnist_test").string();
  std::filesystem::create_directories(dir);
  std::vector<uint8_t> images = idx(0x803, {2, 4, 4}, 32, 0);
  for (int i = 0; i < 16; ++i) images[16 + 16 + size_t(i)] = uint8_t(i * 10);  // image 1: a ramp
  write_gzip(dir + "/t10k-images-idx3-ubyte.gz", images);
  write_gzip(dir + "/t10k-labels-idx1-ubyte.gz", idx(0x801, {2}, 2, 7));
  const ImageSet set = load_fashion_mnist(dir, false);
  EXPECT_EQ(set.count, 2);
  EXPECT_EQ(set.labels[1], 7);
  const Batch b = make_image_batch(set, {1, 0}, 0, 1, 2);
  ASSERT_EQ(b.patches.size(), 16u);  // 2x2 patches of 2x2 pixels
  // Patch (0, 1) of the ramp holds pixels (0,2) (0,3) (1,2) (1,3) = 20, 30, 60, 70.
  const float first = (20.0f / 255 - 0.2860f) / 0.3530f;
  EXPECT_FLOAT_EQ(b.patches[4], first);
  EXPECT_FLOAT_EQ(b.patches[7], (70.0f / 255 - 0.2860f) / 0.3530f);
  EXPECT_EQ(b.targets[0], 7);

  // Broken files are named errors.
  write_gzip(dir + "/t10k-labels-idx1-ubyte.gz", idx(0x801, {3}, 3, 1));
  EXPECT_THAT([&] { load_fashion_mnist(dir, false); },
              ThrowsMessage<Error>(HasSubstr("2 images but")));
  write_gzip(dir + "/t10k-labels-idx1-ubyte.gz", idx(0x801, {2}, 1, 1));
  EXPECT_THAT([&] { load_fashion_mnist(dir, false); },
              ThrowsMessage<Error>(HasSubstr("header promises 2")));
  write_gzip(dir + "/t10k-labels-idx1-ubyte.gz", idx(0x803, {2}, 2, 1));
  EXPECT_THAT([&] { load_fashion_mnist(dir, false); },
              ThrowsMessage<Error>(HasSubstr("not an IDX file")));
  EXPECT_THAT([&] { load_fashion_mnist(dir, true); },
              ThrowsMessage<Error>(HasSubstr("apt-get install dataset-fashion-mnist")));
  std::filesystem::remove_all(dir);
}

TEST(TrainData, FashionMnistPackageFilesLoad) {
  if (!std::filesystem::exists(std::string(kFashionMnistDir) + "/t10k-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist is not installed";
  const ImageSet test = load_fashion_mnist(kFashionMnistDir, false);
  EXPECT_EQ(test.count, 10000);
  EXPECT_EQ(test.height, 28);
  std::vector<int> per_class(10);
  for (uint8_t l : test.labels) ++per_class[l];
  for (int n : per_class) EXPECT_EQ(n, 1000);  // the test split is balanced
}

}  // namespace
}  // namespace mhla::train
