#pragma once
// Size arithmetic that refuses to overflow: tensor sizes come from users, and a
// wrapped product would turn into an undersized buffer.
#include <concepts>
#include <cstdint>
#include <string>
#include <vector>

#include "mhla/error.hpp"

namespace mhla::detail {

// Product of the factors; throws mhla::Error naming what() if it exceeds the
// largest element count whose byte size still fits in int64 (8-byte elements).
// what() is called only on failure, so checks made on every call (a decoding
// step) build no strings.
template <std::invocable Describe>
int64_t checked_product(const std::vector<int64_t>& factors, Describe&& what) {
  constexpr int64_t kMaxElements = INT64_MAX / 8;
  int64_t product = 1;
  for (int64_t f : factors) {
    if (f < 0) throw Error(std::string(what()) + " has a negative factor " + std::to_string(f));
    if (__builtin_mul_overflow(product, f, &product) || product > kMaxElements)
      throw Error(std::string(what()) + " overflows 64-bit byte counts");
  }
  return product;
}

inline int64_t checked_product(const std::vector<int64_t>& factors, const std::string& what) {
  return checked_product(factors, [&] { return what; });
}

}  // namespace mhla::detail
