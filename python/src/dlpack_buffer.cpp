#include "dlpack_buffer.hpp"

#include <cstdlib>
#include <new>

namespace py = pybind11;

namespace mhla::python {
namespace {

// What one exported DLManagedTensor owns: its shape array and a share of the storage.
struct Export {
  std::vector<int64_t> shape;
  std::shared_ptr<void> storage;
  DLManagedTensor managed{};
};

void delete_export(DLManagedTensor* managed) { delete static_cast<Export*>(managed->manager_ctx); }

// Frees an export nobody consumed (a consumer renames the capsule "used_dltensor").
void delete_unused_capsule(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    managed->deleter(managed);
  }
}

}  // namespace

Buffer::Buffer(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  size_t bytes = dtype_size(dtype_);
  for (int64_t extent : shape_) bytes *= static_cast<size_t>(extent);
  // Cache-line aligned, as the kernels' own buffers; never a null pointer.
  const size_t rounded = (bytes + 63) / 64 * 64 + 64 * (bytes == 0);
  void* memory = std::aligned_alloc(64, rounded);
  if (memory == nullptr) throw std::bad_alloc();
  storage_ = std::shared_ptr<void>(memory, std::free);
}

py::capsule Buffer::dlpack(py::object stream) const {
  if (!stream.is_none()) throw py::value_error("__dlpack__: stream must be None for CPU memory");
  auto owned = std::make_unique<Export>();
  Export& e = *owned;
  e.shape = shape_;
  e.storage = storage_;
  e.managed.dl_tensor.data = storage_.get();
  e.managed.dl_tensor.device = DLDevice{kDLCPU, 0};
  e.managed.dl_tensor.ndim = static_cast<int32_t>(shape_.size());
  e.managed.dl_tensor.dtype = to_dlpack(dtype_);
  e.managed.dl_tensor.shape = e.shape.data();
  e.managed.dl_tensor.strides = nullptr;  // C order
  e.managed.dl_tensor.byte_offset = 0;
  e.managed.manager_ctx = &e;
  e.managed.deleter = delete_export;
  py::capsule capsule(&e.managed, "dltensor", delete_unused_capsule);
  owned.release();  // the capsule (or its consumer) now owns it
  return capsule;
}

py::tuple Buffer::dlpack_device() { return py::make_tuple(static_cast<int>(kDLCPU), 0); }

py::buffer_info Buffer::buffer_info() {
  std::vector<py::ssize_t> strides(shape_.size());
  py::ssize_t stride = static_cast<py::ssize_t>(dtype_size(dtype_));
  for (size_t d = shape_.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= shape_[d];
  }
  const std::string format = dtype_ == DType::float32 ? py::format_descriptor<float>::format()
                                                      : py::format_descriptor<double>::format();
  return py::buffer_info(storage_.get(), static_cast<py::ssize_t>(dtype_size(dtype_)), format,
                         static_cast<py::ssize_t>(shape_.size()),
                         std::vector<py::ssize_t>(shape_.begin(), shape_.end()), strides);
}

}  // namespace mhla::python
