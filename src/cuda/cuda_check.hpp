#pragma once
// CUDA runtime calls checked: a failure is an mhla::Error naming the call and
// the runtime's reason, never a silent wrong result.
#include <cuda_runtime.h>

#include <string>

#include "mhla/error.hpp"

namespace mhla::cuda {

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw Error(std::string("mhla (CUDA backend): ") + what + ": " + cudaGetErrorString(status));
}

// After a kernel launch: a bad configuration shows here, a fault at the next
// synchronising call.
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

}  // namespace mhla::cuda
