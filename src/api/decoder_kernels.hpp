#pragma once
// The kernels of the streaming decoder's state (backend::DecodeState), shared
// by its steps (decoder.cpp) and its snapshots (decoder_state.cpp).
#include <memory>

#include "backend/backend.hpp"
#include "mhla/decoder.hpp"

namespace mhla::detail {

// The decoder keeps its state in host memory, so its kernels are the CPU's.
inline std::unique_ptr<backend::DecodeState> decode_state(const char* fn,
                                                          const DecoderOptions& options) {
  return backend::backend_for(fn, "the decoder's state", Device::cpu)
      .decode_state(options.dk, options.dv);
}

}  // namespace mhla::detail
