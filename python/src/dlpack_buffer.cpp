#include "dlpack_buffer.hpp"

#include <cstdlib>
#include <deque>
#include <mutex>
#include <new>
#include <string>
#include <utility>

#include "cuda_interop.hpp"

namespace py = pybind11;

namespace mhla::python {
namespace {

// Freed result buffers of 1 MiB and more, kept for the next result of the
// same size. A fresh allocation that large is mapped by the kernel page by
// page as the operator first writes it, and a training step asks for the
// same sizes every time: at N = 65536, 8 heads of 64, recycling made
// mt.mhla_attention 1.4x faster (bench/recycled_memory_bench.py). At most
// kMaxHeldBytes stay idle; the oldest go back to the system first.
class RecycledMemory {
 public:
  static constexpr size_t kMinBytes = size_t(1) << 20;
  static constexpr size_t kMaxHeldBytes = size_t(2) << 30;

  static RecycledMemory& instance() {
    // Never destroyed: buffers may be freed after static destructors ran.
    static RecycledMemory* pool = new RecycledMemory;
    return *pool;
  }

  void* take(size_t bytes) {
    if (bytes >= kMinBytes) {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto it = idle_.begin(); it != idle_.end(); ++it)
        if (it->first == bytes) {
          void* memory = it->second;
          idle_.erase(it);
          held_ -= bytes;
          return memory;
        }
    }
    void* memory = std::aligned_alloc(64, bytes);
    if (memory == nullptr) {  // the idle results may hold what is missing
      release();
      memory = std::aligned_alloc(64, bytes);
    }
    if (memory == nullptr) throw std::bad_alloc();
    return memory;
  }

  void give(void* memory, size_t bytes) {
    if (bytes < kMinBytes || bytes > kMaxHeldBytes) return std::free(memory);
    std::lock_guard<std::mutex> lock(mutex_);
    while (held_ + bytes > kMaxHeldBytes) {
      std::free(idle_.front().second);
      held_ -= idle_.front().first;
      idle_.pop_front();
    }
    idle_.emplace_back(bytes, memory);
    held_ += bytes;
  }

  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [bytes, memory] : idle_) std::free(memory);
    idle_.clear();
    held_ = 0;
  }

  size_t held() {
    std::lock_guard<std::mutex> lock(mutex_);
    return held_;
  }

 private:
  std::mutex mutex_;
  std::deque<std::pair<size_t, void*>> idle_;  // oldest first
  size_t held_ = 0;
};

// What one exported DLManagedTensor owns: its shape array and a share of the storage.
struct Export {
  std::vector<int64_t> shape;
  std::shared_ptr<void> storage;
  DLManagedTensor managed{};
};

DLDevice dlpack_device_of(Place place) {
  return place.device == Device::cuda ? DLDevice{kDLCUDA, place.id} : DLDevice{kDLCPU, 0};
}

void delete_export(DLManagedTensor* managed) { delete static_cast<Export*>(managed->manager_ctx); }

// Frees an export nobody consumed (a consumer renames the capsule "used_dltensor").
void delete_unused_capsule(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    managed->deleter(managed);
  }
}

}  // namespace

Buffer::Buffer(DType dtype, std::vector<int64_t> shape, Place place)
    : dtype_(dtype), shape_(std::move(shape)), place_(place), stream_(cuda::call_stream()) {
  size_t bytes = dtype_size(dtype_);
  for (int64_t extent : shape_) bytes *= static_cast<size_t>(extent);
  if (place_.device == Device::cuda) {
    storage_ = cuda::allocate(bytes);
    return;
  }
  // Cache-line aligned, as the kernels' own buffers; never a null pointer.
  const size_t rounded = (bytes + 63) / 64 * 64 + 64 * (bytes == 0);
  storage_ = std::shared_ptr<void>(RecycledMemory::instance().take(rounded), [rounded](void* p) {
    RecycledMemory::instance().give(p, rounded);
  });
}

void release_recycled_buffers() { RecycledMemory::instance().release(); }

size_t recycled_buffer_bytes() { return RecycledMemory::instance().held(); }

py::capsule Buffer::dlpack(py::object stream) const {
  if (place_.device == Device::cpu && !stream.is_none())
    throw py::value_error("__dlpack__: stream must be None for CPU memory");
  // None: the consumer works on the legacy default stream.
  if (place_.device == Device::cuda)
    cuda::order_after(stream_, stream.is_none() ? cuda::kLegacyDefaultStream : stream.cast<int64_t>());
  auto owned = std::make_unique<Export>();
  Export& e = *owned;
  e.shape = shape_;
  e.storage = storage_;
  e.managed.dl_tensor.data = storage_.get();
  e.managed.dl_tensor.device = dlpack_device_of(place_);
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

py::tuple Buffer::dlpack_device() const {
  const DLDevice device = dlpack_device_of(place_);
  return py::make_tuple(static_cast<int>(device.device_type), device.device_id);
}

py::dict Buffer::array_interface() const {
  if (place_.device == Device::cuda)
    throw py::type_error("a result on cuda:" + std::to_string(place_.id) +
                         " is not host memory that NumPy can read; read it with torch.from_dlpack");
  if (dtype_ == DType::bfloat16)
    throw py::type_error("a bfloat16 result has no NumPy dtype; read it with torch.from_dlpack");
  // Little-endian IEEE floats of the element's size; C order (no strides).
  const std::string typestr = "<f" + std::to_string(dtype_size(dtype_));
  py::dict interface;
  py::tuple shape(shape_.size());
  for (size_t d = 0; d < shape_.size(); ++d) shape[d] = py::int_(shape_[d]);
  interface["shape"] = shape;
  interface["typestr"] = typestr;
  interface["data"] = py::make_tuple(reinterpret_cast<uintptr_t>(storage_.get()), false);
  interface["version"] = 3;
  return interface;
}

}  // namespace mhla::python
