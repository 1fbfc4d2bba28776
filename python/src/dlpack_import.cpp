#include "dlpack_import.hpp"

#include <cstdint>
#include <string>

#include "cuda_interop.hpp"
#include "mhla/tensor.hpp"

namespace py = pybind11;

namespace mhla::python {
namespace {

std::string device_name(int type, int id) {
  switch (type) {
    case kDLCUDA:
      return "cuda:" + std::to_string(id);
    case kDLROCM:
      return "rocm:" + std::to_string(id);
    case kDLMetal:
      return "mps:" + std::to_string(id);
    default:
      return "DLPack device type " + std::to_string(type) + " (id " + std::to_string(id) + ")";
  }
}

DType dtype_from(const char* name, DLDataType t, bool storage_types) {
  if (t.code == kDLFloat && t.lanes == 1 && t.bits == 32) return DType::float32;
  if (t.code == kDLFloat && t.lanes == 1 && t.bits == 64) return DType::float64;
  if (storage_types && t.code == kDLBfloat && t.lanes == 1 && t.bits == 16) return DType::bfloat16;
  if (storage_types && t.code == kDLFloat && t.lanes == 1 && t.bits == 16) return DType::float16;
  static const char* const codes[] = {"int", "uint", "float", "opaque handle", "bfloat", "complex"};
  const std::string code =
      t.code < 6 ? codes[t.code] : "DLPack type code " + std::to_string(t.code);
  throw py::type_error(std::string(name) + " has dtype " + code + std::to_string(t.bits) +
                       (t.lanes == 1 ? "" : " x" + std::to_string(t.lanes)) +
                       (storage_types ? "; expected float32, float64, bfloat16 or float16"
                                      : "; mhla computes in float32 or float64"));
}

// C order, where dimensions of extent 1 may carry any stride (frameworks
// report arbitrary strides there) and empty tensors have nothing to read.
bool is_c_contiguous(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  int64_t expected = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    if (shape[d] == 0) return true;
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

}  // namespace

ImportedTensor::ImportedTensor(py::handle object, const char* name, bool storage_types,
                               Devices devices)
    : name_(name), storage_types_(storage_types), devices_(devices) {
  if (!py::hasattr(object, "__dlpack__")) {
    if (PyObject_CheckBuffer(object.ptr())) {
      import_buffer(object);
      return;
    }
    throw py::type_error(
        std::string(name) +
        " must be a tensor that supports DLPack (torch.Tensor, numpy.ndarray), not " +
        std::string(py::str(py::type::handle_of(object).attr("__name__"))));
  }
  // A tensor that says where it is gets checked before it is exported; one on
  // CUDA is asked to order its pending work before the call's stream.
  bool on_cuda = false;
  if (py::hasattr(object, "__dlpack_device__")) {
    const auto [type, id] = object.attr("__dlpack_device__")().cast<std::pair<int, int>>();
    on_cuda = admit_device(type, id).device == Device::cuda;
  }
  py::object exported;
  try {
    exported = on_cuda ? object.attr("__dlpack__")(py::arg("stream") = cuda::call_stream())
                       : object.attr("__dlpack__")();
  } catch (py::error_already_set& e) {
    if (e.matches(PyExc_BufferError) && PyObject_CheckBuffer(object.ptr())) {
      import_buffer(object);
      return;
    }
    // Other refusals (a torch tensor that requires grad) keep their own
    // explanation, prefixed with the argument.
    const std::string reason = py::str(e.value());
    py::raise_from(e, PyExc_TypeError,
                   (std::string(name) + " could not be read through DLPack: " + reason).c_str());
    throw py::error_already_set();
  }
  import_dlpack(exported, on_cuda);
}

Place ImportedTensor::admit_device(int type, int id) const {
  if (type == kDLCPU) return {};
  if (type == kDLCUDA && devices_ == Devices::cpu_and_cuda) {
    cuda::check_usable(name_, id);
    return {Device::cuda, id};
  }
  std::string message = std::string(name_) + " is on " + device_name(type, id);
  if (!cuda::backend_built())
    message += "; mhla runs on the CPU: move it there first (e.g. .cpu())";
  else if (devices_ == Devices::cpu_and_cuda)
    message += "; mhla runs on the CPU and on CUDA devices: move it to the CPU first (e.g. .cpu())";
  else
    message +=
        "; this function of mhla runs on the CPU only: move it there first (e.g. .cpu()); "
        "mhla.forward and mhla.backward take CUDA tensors too";
  throw py::value_error(message);
}

void ImportedTensor::import_dlpack(const py::object& capsule, bool ordered) {
  if (!PyCapsule_IsValid(capsule.ptr(), "dltensor"))
    throw py::type_error(std::string(name_) +
                         ".__dlpack__() did not return an unused DLPack capsule");
  owner_ = capsule;
  const DLTensor& t =
      static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"))->dl_tensor;
  place_ = admit_device(t.device.device_type, t.device.device_id);
  if (place_.device == Device::cuda && !ordered) cuda::wait_for_device();
  dtype_ = dtype_from(name_, t.dtype, storage_types_);
  shape_.assign(t.shape, t.shape + t.ndim);
  if (t.strides != nullptr) check_strides(std::vector<int64_t>(t.strides, t.strides + t.ndim));
  set_data(static_cast<const char*>(t.data) + t.byte_offset);
}

void ImportedTensor::import_buffer(py::handle object) {
  view_ = std::make_unique<py::buffer_info>(py::reinterpret_borrow<py::buffer>(object).request());
  owner_ = py::reinterpret_borrow<py::object>(object);
  const py::buffer_info& info = *view_;
  if (info.format == py::format_descriptor<float>::format() && info.itemsize == 4) {
    dtype_ = DType::float32;
  } else if (info.format == py::format_descriptor<double>::format() && info.itemsize == 8) {
    dtype_ = DType::float64;
  } else {
    throw py::type_error(std::string(name_) + " has buffer format '" + info.format +
                         "'; mhla computes in float32 or float64");
  }
  shape_ = info.shape;
  std::vector<int64_t> strides;
  for (int64_t s : info.strides) {
    if (s % info.itemsize != 0)
      throw py::value_error(std::string(name_) + " has strides that are not whole elements");
    strides.push_back(s / info.itemsize);
  }
  check_strides(strides);
  set_data(info.ptr);
}

void ImportedTensor::check_strides(const std::vector<int64_t>& strides) const {
  if (!is_c_contiguous(shape_, strides))
    throw py::value_error(std::string(name_) + " with shape " + shape_to_string(shape_) +
                          " has strides " + shape_to_string(strides) +
                          " (in elements), which is not C order; pass a contiguous tensor "
                          "(torch: .contiguous(), NumPy: numpy.ascontiguousarray)");
}

void ImportedTensor::set_data(const void* data) {
  if (reinterpret_cast<uintptr_t>(data) % dtype_size(dtype_) != 0)
    throw py::value_error(std::string(name_) + " is not aligned to its " + dtype_name(dtype_) +
                          " elements");
  data_ = data;
}

void check_same_dtype(std::initializer_list<const ImportedTensor*> tensors) {
  const ImportedTensor* first = *tensors.begin();
  for (const ImportedTensor* t : tensors)
    if (t->dtype() != first->dtype())
      throw py::type_error(std::string(t->name()) + " has dtype " + dtype_name(t->dtype()) +
                           " but " + first->name() + " has " + dtype_name(first->dtype()) +
                           "; all tensors of one call share a dtype");
}

}  // namespace mhla::python
