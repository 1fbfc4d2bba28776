#include "cpu/workspace.hpp"

#include <array>
#include <string>

#include "core/allocation.hpp"
#include "mhla/line_aligned.hpp"

namespace mhla::cpu {
namespace {

// Cache-line aligned, as the tiles are: the mixer's products read and write
// these arrays by whole vectors, [M, Dk (Dv + 1)] rows of whole lines.
struct LineAlignedDelete {
  void operator()(std::byte* p) const {
    ::operator delete[](p, std::align_val_t{mhla::detail::kCacheLine});
  }
};

struct Buffer {
  std::unique_ptr<std::byte[], LineAlignedDelete> data;
  size_t bytes = 0;
};

// The seam's slots, then the kernels' own.
thread_local std::array<Buffer, size_t(Scratch::count) + size_t(KernelScratch::count)> buffers;

template <typename T>
T* grown(Buffer& b, size_t elements) {
  const size_t bytes = elements * sizeof(T);
  if (b.bytes < bytes) {
    b.data.reset();  // release first: peak memory is the new size, not old + new
    // new[] leaves the bytes uninitialised: every kernel overwrites what it reads.
    b.data = detail::allocating(
        "mhla (operator scratch)", "the block summaries' scratch arrays", double(bytes), [&] {
          return std::unique_ptr<std::byte[], LineAlignedDelete>(
              new (std::align_val_t{mhla::detail::kCacheLine}) std::byte[bytes]);
        });
    b.bytes = bytes;
  }
  return reinterpret_cast<T*>(b.data.get());
}

}  // namespace

template <typename T>
T* scratch(Scratch slot, size_t elements) {
  return grown<T>(buffers[size_t(slot)], elements);
}

template <typename T>
T* scratch(KernelScratch slot, size_t elements) {
  return grown<T>(buffers[size_t(Scratch::count) + size_t(slot)], elements);
}

void release_scratch_buffers() {
  for (Buffer& b : buffers) b = Buffer{};
}

template float* scratch<float>(Scratch, size_t);
template double* scratch<double>(Scratch, size_t);
template uint16_t* scratch<uint16_t>(Scratch, size_t);
template std::byte* scratch<std::byte>(Scratch, size_t);
template float* scratch<float>(KernelScratch, size_t);
template double* scratch<double>(KernelScratch, size_t);
template uint16_t* scratch<uint16_t>(KernelScratch, size_t);

}  // namespace mhla::cpu
