// libFuzzer target: the .npy parser on arbitrary bytes must return an array
// whose values match its shape or throw mhla::Error; anything else is a bug.
#include <cstdint>
#include <cstdlib>

#include "common/npy.hpp"
#include "mhla/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const mhla::tools::NpyArray a = mhla::tools::parse_npy({data, size}, "fuzz.npy");
    int64_t count = 1;
    for (int64_t e : a.shape) count *= e;
    if (count != a.size()) std::abort();  // the parser promised a consistent array
  } catch (const mhla::Error&) {
  }
  return 0;
}
