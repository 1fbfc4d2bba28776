#pragma once
// std::vector storage that starts on a 64-byte cache line, as torch's CPU
// allocator places tensors: rows whose pitch is a whole number of lines are
// then read and written by whole SIMD vectors, none straddling two lines.
// An implementation detail, public because mhla::Decoder's state uses it: the
// library's tiles and scratch, the decoder's state and the benchmarks'
// tensors all allocate through it.
#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

namespace mhla::detail {

inline constexpr std::size_t kCacheLine = 64;

template <typename T>
struct LineAlignedAllocator {
  using value_type = T;
  LineAlignedAllocator() = default;
  template <typename U>
  LineAlignedAllocator(const LineAlignedAllocator<U>&) {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{kCacheLine}));
  }
  void deallocate(T* p, std::size_t) { ::operator delete (p, std::align_val_t{kCacheLine}); }
  template <typename U>
  bool operator==(const LineAlignedAllocator<U>&) const {
    return true;
  }
};

template <typename T>
using LineAlignedVector = std::vector<T, LineAlignedAllocator<T>>;

// n rounded up to a multiple of `multiple` (a row pitch in elements).
inline int64_t round_up(int64_t n, int64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

}  // namespace mhla::detail
