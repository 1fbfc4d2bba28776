// The heatmap PNG decodes to the size and colours its header promises: dark
// for zero, yellow for the largest value, small matrices enlarged by repetition.
#include <gtest/gtest.h>

#include <array>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/heatmap.hpp"
#include "mhla/error.hpp"

#define STB_IMAGE_IMPLEMENTATION
#include <stb/stb_image.h>

namespace mhla::test {
namespace {

namespace fs = std::filesystem;

TEST(Heatmap, DecodesToTheScaleItsHeaderDescribes) {
  const fs::path path = fs::temp_directory_path() / "mhla-heatmap-test.png";
  fs::remove(path);
  // Row 0: 0 and 1/4 of the maximum (square-rooted: half way); row 1: the maximum twice.
  tools::write_heatmap_png(path.string(), {0.0, 1.0, 4.0, 4.0}, 2, 2, /*overwrite=*/false);
  int w = 0, h = 0, channels = 0;
  const std::unique_ptr<uint8_t, void (*)(void*)> pixels(
      stbi_load(path.string().c_str(), &w, &h, &channels, 3), stbi_image_free);
  ASSERT_NE(pixels, nullptr) << stbi_failure_reason();
  EXPECT_EQ(w, 256);  // 2 cells enlarged 128 times
  EXPECT_EQ(h, 256);
  auto at = [&](int x, int y) {
    const uint8_t* p = pixels.get() + (y * w + x) * 3;
    return std::array<int, 3>{p[0], p[1], p[2]};
  };
  EXPECT_EQ(at(0, 0), (std::array<int, 3>{68, 1, 84}));         // zero: dark
  EXPECT_EQ(at(127, 127), (std::array<int, 3>{68, 1, 84}));     // the same cell
  EXPECT_EQ(at(128, 0), (std::array<int, 3>{33, 145, 140}));    // half way: teal
  EXPECT_EQ(at(255, 255), (std::array<int, 3>{253, 231, 37}));  // the maximum: yellow
  EXPECT_EQ(at(0, 128), (std::array<int, 3>{253, 231, 37}));

  EXPECT_THROW(tools::write_heatmap_png(path.string(), {1.0}, 1, 1, /*overwrite=*/false), Error);
  tools::write_heatmap_png(path.string(), {1.0}, 1, 1, /*overwrite=*/true);
  EXPECT_EQ(stbi_info(path.string().c_str(), &w, &h, &channels), 1);
  EXPECT_EQ(w, 256);
  fs::remove(path);
}

}  // namespace
}  // namespace mhla::test
