#pragma once
// Non-owning views of dense, row-major (C order) tensors. The operator never
// allocates its inputs or outputs; it only checks that the shapes agree.
#include <cstdint>
#include <string>
#include <vector>

namespace mhla {

template <typename T>
struct TensorView {
  T* data = nullptr;
  std::vector<int64_t> shape;  // row-major, innermost dimension last

  // A mutable view converts to a read-only one.
  operator TensorView<const T>() const { return {data, shape}; }
};

// "[2, 64, 8, 32]"
std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace mhla
