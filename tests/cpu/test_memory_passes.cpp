// The CPU backend's element-wise passes (backend/memory.hpp), each against
// what it is defined to write, and a pass it does not define refused.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "backend/backend.hpp"

namespace {

using mhla::bfloat16;
using mhla::float16;
using namespace mhla::backend;

const Memory& cpu_memory() { return cpu_backend().memory(); }

TEST(MemoryPasses, ZeroCopyAndAddWriteWhatTheySay) {
  std::vector<double> from = {1.5, -2.25, 3.0}, to = {7.0, 8.0, 9.0};
  add(cpu_memory(), from.data(), 3, to.data());
  EXPECT_EQ(to, (std::vector<double>{8.5, 5.75, 12.0}));
  std::vector<float> f = {1, 2, 3}, g(3, 5.0f);
  EXPECT_TRUE(convert(cpu_memory(), f.data(), 3, g.data()));
  EXPECT_EQ(g, f);
  zero(cpu_memory(), g.data(), 2);
  EXPECT_EQ(g, (std::vector<float>{0, 0, 3}));
}

TEST(MemoryPasses, SixteenBitTypesWidenExactlyAndNarrowToNearestEven) {
  // 1 + 2^-8 is a tie between two bfloat16 values: it rounds to the even one, 1.
  const std::vector<float> wide = {1.0f + 0x1p-8f, -3.5f, 0x1p-130f};
  std::vector<bfloat16> narrow(3);
  EXPECT_TRUE(convert(cpu_memory(), wide.data(), 3, narrow.data()));
  std::vector<float> back(3);
  EXPECT_TRUE(convert(cpu_memory(), narrow.data(), 3, back.data()));
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], -3.5f);
  EXPECT_EQ(back[2], mhla::to_float(mhla::to_bfloat16(0x1p-130f)));
  std::vector<float16> half(3);
  EXPECT_TRUE(convert(cpu_memory(), wide.data(), 3, half.data()));
  EXPECT_TRUE(convert(cpu_memory(), half.data(), 3, back.data()));
  EXPECT_EQ(back[1], -3.5f);
}

TEST(MemoryPasses, NarrowingAFiniteValuePastFloat16sRangeIsReported) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float16> half(2);
  const std::vector<float> past = {1.0f, 70000.0f}, infinite = {1.0f, inf};
  EXPECT_FALSE(convert(cpu_memory(), past.data(), 2, half.data()));
  EXPECT_TRUE(convert(cpu_memory(), infinite.data(), 2, half.data()));  // infinite before: not lost
}

TEST(MemoryPasses, APassTheBackendDoesNotDefineIsRefused) {
  std::vector<bfloat16> a(2), b(2);
  const Elementwise add_bfloat16{
      Elementwise::Kind::add, Element::bfloat16, Element::bfloat16, a.data(), b.data(), 2};
  EXPECT_THROW(cpu_memory().elementwise(add_bfloat16), std::logic_error);
  std::vector<double> d(2);
  EXPECT_THROW(convert(cpu_memory(), d.data(), 2, b.data()), std::logic_error);
}

}  // namespace
