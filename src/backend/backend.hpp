#pragma once
// The seam between the API and the devices that run MHLA: what the operator's
// entry points, which run on every device of the build, ask of a device. An
// entry point validates its call once (core/validated_call.hpp) and hands the
// problem to the backend of its tensors' device, which runs the operator
// there; its Memory (memory.hpp) holds the scratch and element-wise work the
// API needs around it. Every pointer a backend receives is memory of its
// device. The entry points that run on the CPU only (the phases, the softmax
// baseline, the decoder) call the CPU's kernels themselves (cpu/).
//
// Summary arrays are [B*H, M, Dk*(Dv+1)]; token tensors [B, N, H, D] (Dk for
// q and k, Dv for v and o). Functions returning bool return whether every
// result they wrote is finite (the API then searches the results, on the host,
// only when something went wrong).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "backend/memory.hpp"
#include "core/validate.hpp"
#include "mhla/bfloat16.hpp"
#include "mhla/float16.hpp"
#include "mhla/tensor.hpp"

namespace mhla::backend {

// The kernels of one validated problem and its mixing matrix.
template <typename T>
class Attention {
 public:
  virtual ~Attention() = default;
  // The whole operator. saved_summaries and saved_mixed are optional
  // (nullptr): forward keeps the summaries and the mixed summaries there, and
  // backward reads them instead of recomputing them. backward adds to grad_w
  // (nullptr for the parameter-free mix of linear attention).
  virtual bool forward(const T* q, const T* k, const T* v, T* o, T* saved_summaries,
                       T* saved_mixed) const = 0;
  virtual bool backward(const T* q, const T* k, const T* v, const T* grad_o, T* grad_q, T* grad_k,
                        T* grad_v, T* grad_w, const T* saved_summaries,
                        const T* saved_mixed) const = 0;
};

// The operator on 16-bit q, k, v, o and their gradients (H: bfloat16 or
// float16), with float w, summaries and grad_w, summed in float. A backend
// without such backward kernels for the problem returns false from backward
// without writing; the API then runs the float kernels on widened copies, as
// it does on any false.
template <typename H>
class HalfAttention {
 public:
  virtual ~HalfAttention() = default;
  virtual bool forward(const H* q, const H* k, const H* v, H* o, float* saved_summaries,
                       float* saved_mixed) const = 0;
  virtual bool backward(const H* q, const H* k, const H* v, const H* grad_o, H* grad_q, H* grad_k,
                        H* grad_v, float* grad_w, const float* saved_summaries,
                        const float* saved_mixed) const = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // The kernels of `problem` with mixing matrix `w` as the problem describes
  // it (dense or Toeplitz, shared or per head), or with w == nullptr the
  // parameter-free sum of linear attention (every W entry 1); nullptr where
  // the device has no kernels for the problem (the API refuses the call by
  // name: a backend never throws for a call the API accepted).
  virtual std::unique_ptr<Attention<float>> attention(const detail::Problem& problem,
                                                      const float* w) const = 0;
  virtual std::unique_ptr<Attention<double>> attention(const detail::Problem& problem,
                                                       const double* w) const = 0;
  // 16-bit kernels for the problem (the last argument names the type), or
  // nullptr where the device has none for it: the API then computes in float
  // on widened copies.
  virtual std::unique_ptr<HalfAttention<bfloat16>> half_attention(const detail::Problem& problem,
                                                                  const float* w,
                                                                  bfloat16) const = 0;
  virtual std::unique_ptr<HalfAttention<float16>> half_attention(const detail::Problem& problem,
                                                                 const float* w, float16) const = 0;

  // The device's memory: scratch arrays, element-wise work, copies to the host.
  virtual const Memory& memory() const = 0;

  // Throws the first failed check of the calling thread's deferred calls
  // (mhla/device_execution.hpp): of those already done (wait false), or
  // after waiting for all. Backends that check every call before it returns
  // have none.
  virtual void raise_deferred(bool /*wait*/) const {}
};

// Each backend is defined in its own folder: the CPU's in src/cpu/cpu_backend.cpp,
// the CUDA backend (built with MHLA_WITH_CUDA) in src/cuda/cuda_backend.cpp.
const Backend& cpu_backend();
const Backend& cuda_backend();
// Whether the CUDA runtime sees a device; if not, the runtime's reason.
bool cuda_device_present();
std::string cuda_absence_reason();

// The backend of `device`; mhla::Error from `fn` naming the tensor `name`
// when this build has none.
const Backend& backend_for(const char* fn, const char* name, Device device);

}  // namespace mhla::backend
