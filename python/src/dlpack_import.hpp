#pragma once
// Reading caller tensors through DLPack without copying them.
//
// Any object with __dlpack__ (torch.Tensor, numpy.ndarray, ...) is accepted if
// it is a float32/float64 tensor in C order, in CPU memory (or, where the
// caller admits it, on the current CUDA device: see cuda_interop.hpp). Objects
// that refuse to export (NumPy's read-only arrays: DLPack 0.6 cannot mark
// memory read-only) are read through the buffer protocol instead, under the
// same checks. Anything else is a Python exception naming the argument and the
// problem; nothing is copied.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "dlpack_buffer.hpp"
#include "dtype.hpp"
#include "mhla/tensor.hpp"

namespace mhla::python {

// The devices an argument may be on: the CPU, or (for the entry points with a
// CUDA backend, whose views carry the device to the library) CUDA as well.
enum class Devices { cpu, cpu_and_cuda };

class ImportedTensor {
 public:
  // `name` ("q", "grad_o", ...) starts every error message. With
  // `storage_types`, bfloat16 and float16 tensors are admitted too (for conversions).
  ImportedTensor(pybind11::handle object, const char* name, bool storage_types = false,
                 Devices devices = Devices::cpu);

  const char* name() const { return name_; }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  Place place() const { return place_; }

  template <typename T>
  TensorView<const T> view() const {
    return {static_cast<const T*>(data_), shape_, place_.device};
  }

 private:
  const char* name_;
  bool storage_types_;
  Devices devices_;
  // Raises unless a tensor on DLPack device (type, id) may be read; returns its place.
  Place admit_device(int type, int id) const;
  // `ordered`: the producer was asked to order its pending work before ours.
  void import_dlpack(const pybind11::object& capsule, bool ordered);
  void import_buffer(pybind11::handle object);
  void check_strides(const std::vector<int64_t>& strides) const;
  void set_data(const void* data);  // after dtype_ is known: checks the alignment

  pybind11::object owner_;                       // keeps the memory alive: the DLPack capsule
  std::unique_ptr<pybind11::buffer_info> view_;  // or the buffer-protocol view
  const void* data_ = nullptr;
  DType dtype_ = DType::float32;
  Place place_;
  std::vector<int64_t> shape_;
};

// Raises TypeError unless every tensor has the dtype of the first one.
void check_same_dtype(std::initializer_list<const ImportedTensor*> tensors);

}  // namespace mhla::python
