#pragma once
// Memory the bindings allocate for results, on the CPU or on the inputs' CUDA
// device, handed to the caller's framework through the DLPack protocol
// (torch.from_dlpack) or, on the CPU, NumPy's array interface (numpy.asarray)
// without a copy. The memory lives as long as any tensor made from it.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "dtype.hpp"
#include "mhla/tensor.hpp"

namespace mhla::python {

// Where a tensor's memory is: the device kind and, for CUDA, its index.
struct Place {
  Device device = Device::cpu;
  int id = 0;
};

class Buffer {
 public:
  Buffer(DType dtype, std::vector<int64_t> shape, Place place = {});

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }

  template <typename T>
  TensorView<T> view() {
    return {static_cast<T*>(storage_.get()), shape_, place_.device};
  }

  // The DLPack protocol. For CPU memory `stream` must be None; for CUDA
  // memory the consumer's stream (DLPack's code; None: the legacy default
  // stream) is made to wait for the computation that wrote it.
  pybind11::capsule dlpack(pybind11::object stream) const;
  pybind11::tuple dlpack_device() const;
  // NumPy's array interface: numpy.asarray(buffer) is a writable view that
  // keeps the buffer alive (numpy.from_dlpack would mark it read-only). Not
  // the buffer protocol: an error there cannot reach Python (pybind11 2.10
  // terminates the process), and CUDA or bfloat16 results must be refused.
  pybind11::dict array_interface() const;

 private:
  DType dtype_;
  std::vector<int64_t> shape_;
  Place place_;
  int64_t stream_;  // CUDA memory: the stream of the call that writes it (DLPack's code)
  std::shared_ptr<void> storage_;
};

// Results of 1 MiB or more reuse the memory of freed ones of the same size
// (at most 2 GiB is kept idle): these free it, and say how much is kept.
void release_recycled_buffers();
size_t recycled_buffer_bytes();

}  // namespace mhla::python
