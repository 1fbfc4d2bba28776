// libFuzzer target: the safetensors decoder (checkpoint loading) on arbitrary
// bytes must return tensors whose values match their shapes or throw
// mhla::Error; anything else is a bug.
#include <cstdint>
#include <cstdlib>

#include "mhla/error.hpp"
#include "train/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const mhla::train::SafeTensors file =
        mhla::train::decode_safetensors({data, size}, "fuzz.safetensors");
    for (const auto& [name, tensor] : file.tensors) {
      int64_t count = 1;
      for (int64_t e : tensor.shape) count *= e;
      if (count != int64_t(tensor.data.size()))
        std::abort();  // the decoder promised a consistent tensor
    }
  } catch (const mhla::Error&) {
  }
  return 0;
}
