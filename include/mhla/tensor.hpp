#pragma once
// Non-owning views of dense, row-major (C order) tensors. The operator never
// allocates its inputs or outputs; it only checks that the shapes agree.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace mhla {

// Where a tensor's memory lives. Every entry point checks it before reading:
// a call runs on the backend of q's device (the CPU's always, CUDA's in
// builds with MHLA_WITH_CUDA), and a view of memory that backend cannot read
// is refused by name instead of being dereferenced.
enum class Device { cpu, cuda };
const char* to_string(Device device);

template <typename T>
struct TensorView {
  T* data = nullptr;
  std::vector<int64_t> shape;  // row-major, innermost dimension last
  Device device = Device::cpu;

  TensorView() = default;
  TensorView(T* data_, std::vector<int64_t> shape_, Device device_ = Device::cpu)
      : data(data_), shape(std::move(shape_)), device(device_) {}

  // A mutable view converts to a read-only one.
  operator TensorView<const T>() const { return {data, shape, device}; }
};

// "[2, 64, 8, 32]"
std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace mhla
