// The CUDA backend: the operator's phases as the one-thread-per-result
// kernels of cuda/thread_per_result_kernels.cuh, with per-thread device
// scratch; the bfloat16 operator on tensor cores (cuda/bf16_*_kernels.cuh),
// token-level causal masking included. Every call runs on the stream of the
// thread's DeviceExecution, its checks read back as call_status.hpp says.
// Token-level causal masking in float and double, the decoder's step and the
// softmax baseline are not implemented on CUDA and are refused by name.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/backend.hpp"
#include "cuda/bf16_backward_kernels.cuh"
#include "cuda/bf16_forward_kernels.cuh"
#include "cuda/bf16_mix_kernels.cuh"
#include "cuda/bf16_state_backward.cuh"
#include "cuda/bf16_state_forward.cuh"
#include "cuda/bf16_state_plan.hpp"
#include "cuda/call_status.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/elementwise.cuh"
#include "cuda/kernel_problem_of.hpp"
#include "cuda/thread_per_result_kernels.cuh"
#include "mhla/device_execution.hpp"

namespace mhla::cuda {
namespace {

using backend::Scratch;

// One device allocation, freed with its owner.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) check(cudaMalloc(&data_, bytes), "cudaMalloc");
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);
  }
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Arrays kept between calls, one set per thread, that only grow.
class ScratchArrays {
 public:
  explicit ScratchArrays(size_t slots) : buffers_(slots) {}
  void* get(size_t slot, size_t bytes) {
    DeviceBuffer& buffer = buffers_[slot];
    if (buffer.bytes() < bytes) buffer = DeviceBuffer(bytes);
    return buffer.data();
  }
  void release() {
    for (DeviceBuffer& buffer : buffers_) buffer = DeviceBuffer();
  }

 private:
  std::vector<DeviceBuffer> buffers_;
};

// The API's slots (backend::Scratch) and the attention kernels' own.
enum class Own {
  grad_mixed,
  grad_summaries,
  token_terms,
  mix_backward,
  diagonal,
  flag,
  bf16_state,
  bf16_state_gradients,
  count
};
thread_local ScratchArrays api_scratch{size_t(Scratch::count)};
thread_local ScratchArrays own_scratch{size_t(Own::count)};

template <typename T>
T* own(Own slot, int64_t count) {
  return static_cast<T*>(own_scratch.get(size_t(slot), size_t(count) * sizeof(T)));
}

template <typename T>
T* api_slot(Scratch slot, int64_t count) {
  return static_cast<T*>(api_scratch.get(size_t(slot), size_t(count) * sizeof(T)));
}

template <typename T>
void upload(const std::vector<T>& host, T* device) {
  check(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
        "cudaMemcpy (host to device)");
}

// A layout's block arrays (kernel_problem_of.hpp) on the device.
struct DeviceBlockArrays {
  DeviceBuffer arrays;
  int64_t largest_block = 0;
};

// The block arrays of the layouts a thread used last, kept on the device:
// a model calls the operator with few layouts, and building and uploading
// O(N) arrays (with an allocation and a synchronising free) on every call
// costs more than a short call's kernels. Keyed by the current device and
// the block table's runs.
class BlockArrayCache {
 public:
  std::shared_ptr<const DeviceBlockArrays> get(const detail::BlockTableView& table, int64_t n) {
    int device = 0;
    check(cudaGetDevice(&device), "cudaGetDevice");
    std::vector<int64_t> key = {device, n, table.blocks};
    key.insert(key.end(), table.run_start, table.run_start + table.blocks + 1);
    for (int64_t r = 0; r < table.run_start[table.blocks]; ++r) {
      key.push_back(table.runs[r].first);
      key.push_back(table.runs[r].length);
    }
    for (const Entry& entry : entries_)
      if (entry.key == key) return entry.arrays;
    if (entries_.size() == kEntries) entries_.erase(entries_.begin());
    entries_.push_back({std::move(key), build(table, n)});
    return entries_.back().arrays;
  }
  void clear() { entries_.clear(); }

 private:
  static constexpr size_t kEntries = 8;
  struct Entry {
    std::vector<int64_t> key;
    std::shared_ptr<const DeviceBlockArrays> arrays;
  };

  static std::shared_ptr<const DeviceBlockArrays> build(const detail::BlockTableView& table,
                                                        int64_t n) {
    const BlockArrays host = block_arrays(table, n);
    auto device = std::make_shared<DeviceBlockArrays>();
    device->largest_block = host.largest_block;
    device->arrays = DeviceBuffer(host.values.size() * sizeof(int64_t));
    upload(host.values, static_cast<int64_t*>(device->arrays.data()));
    return device;
  }

  std::vector<Entry> entries_;
};

thread_local BlockArrayCache block_arrays;

// The block geometry of a validated problem as device arrays, and the
// kernels' view of the problem.
class Geometry {
 public:
  explicit Geometry(const detail::Problem& p, TokenFormat token_format = TokenFormat::bfloat16)
      : arrays_(block_arrays.get(p.table, p.tokens)),
        problem_(kernel_problem(p, static_cast<const int64_t*>(arrays_->arrays.data()),
                                arrays_->largest_block)) {
    problem_.token_format = token_format;
  }
  const KernelProblem& problem() const { return problem_; }
  // The elements of the summaries and of the mixed summaries, [B*H, M, Dk, Dv + 1].
  int64_t summary_elements() const {
    return problem_.batch * problem_.heads * problem_.blocks * problem_.dk * (problem_.dv + 1);
  }

 private:
  std::shared_ptr<const DeviceBlockArrays> arrays_;
  KernelProblem problem_;
};

// The inputs whose entries could explain a non-finite result: q, k, v in a
// forward, and grad_o too in a backward.
int64_t tokens(const KernelProblem& p) { return p.batch * p.tokens * p.heads; }
template <typename T>
CheckedInputs<T> forward_inputs(const KernelProblem& p, const T* q, const T* k, const T* v) {
  return {{{q, tokens(p) * p.dk}, {k, tokens(p) * p.dk}, {v, tokens(p) * p.dv}}, 3, p.token_format};
}
template <typename T>
CheckedInputs<T> backward_inputs(const KernelProblem& p, const T* q, const T* k, const T* v,
                                 const T* grad_o) {
  CheckedInputs<T> inputs = forward_inputs(p, q, k, v);
  inputs.x[inputs.count++] = {grad_o, tokens(p) * p.dv};
  return inputs;
}

// One call's checks (call_status.hpp); a call whose status is not queued
// uses the thread's scratch status.
template <typename W>
CallStatus call_status(const char* fn, const detail::Problem& problem, const KernelProblem& kernels,
                       const W* w) {
  return CallStatus(fn, problem, kernels, w, own<DeviceStatus>(Own::flag, 1));
}

// The operator on tensor cores for tokens of type H (bfloat16, float16, or
// float where the call's options.cuda.float32_tensor_cores says so), with
// float w and state: the forward's summaries, mix and outputs; the backward's
// query gradients (with the per-token terms), the mixed summaries' gradient,
// the mix's backward and the key and value gradients; or, where
// options.cuda.bf16_state says so for the 16-bit types, the bfloat16-state
// kernels.
template <typename H>
class CudaTensorCoreAttention final : public backend::HalfAttention<H> {
 public:
  static constexpr bool kSixteenBit = sizeof(H) == 2;
  CudaTensorCoreAttention(const detail::Problem& p, const float* w)
      : problem_(p), geometry_(p, format()), w_(w) {}
  bool fits() const { return bf16_kernels_fit(geometry_.problem()); }

  bool forward(const H* q, const H* k, const H* v, H* o, float* saved_summaries,
               float* saved_mixed) const override {
    const KernelProblem& p = geometry_.problem();
    const cudaStream_t stream = current_stream();
    CallStatus status = call_status("mhla::forward", problem_, p, w_);
    if (state_kernels(saved_summaries, saved_mixed) && bf16_state_forward_fits(p, q, k, v, o)) {
      bf16_state_forward(p, bits(q), bits(k), bits(v), w_, bits(o), bf16_state(p, Own::bf16_state),
                         status.non_finite(), stream);
    } else {
      const int64_t elements = geometry_.summary_elements();
      float* s = saved_summaries ? saved_summaries : api_slot<float>(Scratch::summaries, elements);
      float* m = saved_mixed ? saved_mixed : api_slot<float>(Scratch::mixed, elements);
      bf16_summaries(p, k, v, s, stream);
      bf16_mix(p, w_, s, m, stream);
      bf16_outputs(p, q, k, v, w_, m, o, status.non_finite(), stream);
    }
    return !status.raised(forward_inputs(p, checked(q), checked(k), checked(v)));
  }
  bool backward(const H* q, const H* k, const H* v, const H* grad_o, H* grad_q, H* grad_k,
                H* grad_v, float* grad_w, const float* saved_summaries,
                const float* saved_mixed) const override {
    const KernelProblem& p = geometry_.problem();
    const cudaStream_t stream = current_stream();
    CallStatus status = call_status("mhla::backward", problem_, p, w_);
    // Saved float state is read by these kernels only; without it the
    // bfloat16-state kernels recompute their own.
    if (state_kernels(saved_summaries, saved_mixed) &&
        bf16_state_backward_fits(p, q, k, v, grad_o, grad_q, grad_k, grad_v)) {
      bf16_state_backward(p, bits(q), bits(k), bits(v), w_, bits(grad_o), bits(grad_q),
                          bits(grad_k), bits(grad_v), grad_w, bf16_state(p, Own::bf16_state),
                          bf16_state(p, Own::bf16_state_gradients),
                          own<float>(Own::mix_backward, bf16_state_backward_scratch(p)),
                          status.non_finite(), stream);
      return !status.raised(
          backward_inputs(p, checked(q), checked(k), checked(v), checked(grad_o)));
    }
    const int64_t elements = geometry_.summary_elements();
    const float* s = saved_summaries;
    if (s == nullptr) {
      float* fresh = api_slot<float>(Scratch::summaries, elements);
      bf16_summaries(p, k, v, fresh, stream);
      s = fresh;
    }
    const float* m = saved_mixed;
    if (m == nullptr) {
      float* fresh = api_slot<float>(Scratch::mixed, elements);
      bf16_mix(p, w_, s, fresh, stream);
      m = fresh;
    }
    float* terms = own<float>(Own::token_terms, 2 * p.batch * p.tokens * p.heads);
    float* grad_mixed = own<float>(Own::grad_mixed, elements);
    float* grad_summaries = own<float>(Own::grad_summaries, elements);
    float* mix_scratch = own<float>(Own::mix_backward, bf16_mix_backward_scratch(p));
    float* diagonal = p.causal ? own<float>(Own::diagonal, bf16_diagonal_terms(p)) : nullptr;
    int* flag = status.non_finite();
    bf16_query_gradients(p, q, k, v, grad_o, w_, m, grad_q, terms, diagonal, flag, stream);
    bf16_mixed_gradients(p, q, grad_o, terms, grad_mixed, stream);
    bf16_mix_backward(p, w_, s, grad_mixed, diagonal, grad_summaries, grad_w, mix_scratch, flag,
                      stream);
    bf16_key_value_gradients(p, q, k, v, grad_o, w_, terms, grad_summaries, grad_k, grad_v, flag,
                             stream);
    return !status.raised(backward_inputs(p, checked(q), checked(k), checked(v), checked(grad_o)));
  }

 private:
  // The kernels' state (or its gradients) in one scratch array: z and z~
  // (float), then S and S~ (bfloat16), each 16-byte aligned (Dk and Dv are
  // multiples of 8).
  static Bf16State bf16_state(const KernelProblem& p, Own slot) {
    const state::StateSizes sizes = state::state_sizes(p);
    auto* floats = own<float>(slot, 2 * sizes.normalisers + sizes.summaries);
    auto* rows = reinterpret_cast<uint16_t*>(floats + 2 * sizes.normalisers);
    return {rows, floats, rows + sizes.summaries, floats + sizes.normalisers};
  }
  static constexpr TokenFormat format() {
    return std::is_same_v<H, float>     ? TokenFormat::float32
           : std::is_same_v<H, float16> ? TokenFormat::float16
                                        : TokenFormat::bfloat16;
  }
  // The bfloat16-state kernels keep their state to themselves, so a call
  // with saved arrays stays on the split-operand kernels; float tokens too.
  bool state_kernels(const float* saved_summaries, const float* saved_mixed) const {
    return kSixteenBit && saved_summaries == nullptr && saved_mixed == nullptr &&
           problem_.cuda_bf16_state;
  }
  static const uint16_t* bits(const H* x) { return reinterpret_cast<const uint16_t*>(x); }
  static uint16_t* bits(H* x) { return reinterpret_cast<uint16_t*>(x); }
  // The inputs as the status check reads them: 16-bit patterns of the
  // problem's format, or floats.
  static auto checked(const H* x) {
    if constexpr (kSixteenBit)
      return bits(x);
    else
      return x;
  }

  const detail::Problem& problem_;
  const Geometry geometry_;
  const float* w_;
};

// The float and double operator, one thread per result; float calls of the
// whole operator run on the tensor-core kernels instead where the call asks
// for them (options.cuda.float32_tensor_cores) and they fit.
template <typename T>
class CudaAttention final : public backend::Attention<T> {
 public:
  CudaAttention(const detail::Problem& p, const T* w) : problem_(p), geometry_(p), w_(w) {
    if constexpr (std::is_same_v<T, float>) {
      if (!p.cuda_float32_tensor_cores) return;
      auto kernels = std::make_unique<CudaTensorCoreAttention<float>>(p, w);
      if (kernels->fits()) tensor_cores_ = std::move(kernels);
    }
  }
  // Whether the whole operator runs on the tensor-core kernels (token-level
  // causal masking, which the kernels here refuse, included).
  bool on_tensor_cores() const { return tensor_cores_ != nullptr; }

  bool forward(const T* q, const T* k, const T* v, T* o, T* saved_summaries,
               T* saved_mixed) const override {
    if constexpr (std::is_same_v<T, float>)
      if (tensor_cores_) return tensor_cores_->forward(q, k, v, o, saved_summaries, saved_mixed);
    T* s = saved_summaries ? saved_summaries : api_slot<T>(Scratch::summaries, summary_elements());
    T* m = saved_mixed ? saved_mixed : api_slot<T>(Scratch::mixed, summary_elements());
    CallStatus status = call_status("mhla::forward", problem_, p(), w_);
    summaries(k, v, s);
    mix(s, m);
    cuda::outputs(p(), q, m, o, status.non_finite(), stream());
    return !status.raised(forward_inputs(p(), q, k, v));
  }

  bool backward(const T* q, const T* k, const T* v, const T* grad_o, T* grad_q, T* grad_k,
                T* grad_v, T* grad_w, const T* saved_summaries,
                const T* saved_mixed) const override {
    if constexpr (std::is_same_v<T, float>)
      if (tensor_cores_)
        return tensor_cores_->backward(q, k, v, grad_o, grad_q, grad_k, grad_v, grad_w,
                                       saved_summaries, saved_mixed);
    CallStatus status = call_status("mhla::backward", problem_, p(), w_);
    const T* s = saved_summaries;
    if (s == nullptr) {
      T* fresh = api_slot<T>(Scratch::summaries, summary_elements());
      summaries(k, v, fresh);
      s = fresh;
    }
    const T* m = saved_mixed;
    if (m == nullptr) {
      T* fresh = api_slot<T>(Scratch::mixed, summary_elements());
      mix(s, fresh);
      m = fresh;
    }
    T* grad_mixed = own<T>(Own::grad_mixed, summary_elements());
    T* grad_summaries = own<T>(Own::grad_summaries, summary_elements());
    run_output_gradients(q, grad_o, m, grad_mixed, grad_q, status.non_finite());
    cuda::mix_backward(p(), w_, s, grad_mixed, grad_summaries, grad_w, status.non_finite(),
                       stream());
    cuda::key_value_gradients(p(), k, v, grad_summaries, grad_k, grad_v, status.non_finite(),
                              stream());
    return !status.raised(backward_inputs(p(), q, k, v, grad_o));
  }

 private:
  void summaries(const T* k, const T* v, T* summaries) const {
    cuda::summaries(p(), k, v, summaries, stream());
  }
  void mix(const T* summaries, T* mixed) const { cuda::mix(p(), w_, summaries, mixed, stream()); }
  const KernelProblem& p() const { return geometry_.problem(); }
  int64_t summary_elements() const { return geometry_.summary_elements(); }
  static cudaStream_t stream() { return current_stream(); }
  void run_output_gradients(const T* q, const T* grad_o, const T* mixed, T* grad_mixed, T* grad_q,
                            int* flag) const {
    T* terms = own<T>(Own::token_terms, 2 * p().batch * p().tokens * p().heads);
    cuda::output_gradients(p(), q, mixed, grad_o, grad_q, grad_mixed, terms, flag, stream());
  }

  const detail::Problem& problem_;
  const Geometry geometry_;
  const T* w_;
  std::unique_ptr<CudaTensorCoreAttention<float>> tensor_cores_;  // float, where asked for
};

// The device's memory: the calling thread's scratch arrays, element-wise
// kernels and asynchronous copies, all on the thread's stream.
class CudaMemory final : public backend::Memory {
 public:
  void* scratch(Scratch slot, size_t bytes) const override {
    return api_scratch.get(size_t(slot), bytes);
  }
  std::shared_ptr<void> allocate(size_t bytes) const override {
    auto buffer = std::make_shared<DeviceBuffer>(bytes);
    return {buffer, buffer->data()};  // the buffer, owned through its data's pointer
  }
  void release_scratch() const override {
    api_scratch.release();
    own_scratch.release();
    block_arrays.clear();
  }

  // A narrowing to float16 reads one flag back a call: the float16 path past
  // the tensor-core kernels waits for it, as a sync call waits for its
  // checks; a call being captured into a graph leaves it unread, as it leaves
  // its other checks.
  bool elementwise(const backend::Elementwise& pass) const override {
    using backend::Element;
    using Kind = backend::Elementwise::Kind;
    const cudaStream_t stream = current_stream();
    const int64_t n = pass.n;
    const Element from = pass.from_type, to = pass.to_type;
    const size_t bytes = size_t(n) * backend::element_bytes(to);
    if (pass.kind == Kind::zero) {
      check(cudaMemsetAsync(pass.to, 0, bytes, stream), "cudaMemsetAsync");
      return true;
    }
    if (pass.kind == Kind::copy && from == to) {
      check(cudaMemcpyAsync(pass.to, pass.from, bytes, cudaMemcpyDeviceToDevice, stream),
            "cudaMemcpyAsync (device to device)");
      return true;
    }
    if (pass.kind == Kind::add && from == to && from == Element::float32) {
      cuda::add(static_cast<const float*>(pass.from), n, static_cast<float*>(pass.to), stream);
      return true;
    }
    if (pass.kind == Kind::add && from == to && from == Element::float64) {
      cuda::add(static_cast<const double*>(pass.from), n, static_cast<double*>(pass.to), stream);
      return true;
    }
    const auto* half_from = static_cast<const uint16_t*>(pass.from);
    auto* half_to = static_cast<uint16_t*>(pass.to);
    if (pass.kind == Kind::copy && to == Element::float32 && from == Element::bfloat16) {
      cuda::widen(half_from, n, static_cast<float*>(pass.to), stream);
      return true;
    }
    if (pass.kind == Kind::copy && to == Element::float32 && from == Element::float16) {
      cuda::widen_f16(half_from, n, static_cast<float*>(pass.to), stream);
      return true;
    }
    if (pass.kind == Kind::copy && from == Element::float32 && to == Element::bfloat16) {
      cuda::narrow(static_cast<const float*>(pass.from), n, half_to, stream);
      return true;
    }
    if (pass.kind == Kind::copy && from == Element::float32 && to == Element::float16) {
      int* flag = static_cast<int*>(scratch(Scratch::range_flag, sizeof(int)));
      check(cudaMemsetAsync(flag, 0, sizeof(int), stream), "cudaMemsetAsync");
      cuda::narrow_f16(static_cast<const float*>(pass.from), n, half_to, flag, stream);
      if (capturing(stream)) return true;
      int overflowed = 0;
      to_host(flag, sizeof(int), &overflowed);
      return overflowed == 0;
    }
    throw std::logic_error("mhla: an element-wise pass the CUDA backend does not define");
  }
  // In the order of the calls' stream, which may not wait for the legacy one.
  void to_host(const void* from, size_t bytes, void* to) const override {
    const cudaStream_t stream = current_stream();
    check(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync (device to host)");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
};

class CudaBackend final : public backend::Backend {
 public:
  std::unique_ptr<backend::Attention<float>> attention(const detail::Problem& p,
                                                       const float* w) const override {
    return make_attention(p, w);
  }
  std::unique_ptr<backend::Attention<double>> attention(const detail::Problem& p,
                                                        const double* w) const override {
    return make_attention(p, w);
  }
  std::unique_ptr<backend::HalfAttention<bfloat16>> half_attention(const detail::Problem& p,
                                                                   const float* w,
                                                                   bfloat16) const override {
    return make_half_attention<bfloat16>(p, w);
  }
  // float16 on the tensor-core kernels only where the call asks (until they
  // have run on a GPU); otherwise the API's float path on widened copies.
  std::unique_ptr<backend::HalfAttention<float16>> half_attention(const detail::Problem& p,
                                                                  const float* w,
                                                                  float16) const override {
    if (!p.cuda_float16_tensor_cores) return nullptr;
    return make_half_attention<float16>(p, w);
  }
  const backend::Memory& memory() const override { return memory_; }
  void raise_deferred(bool wait) const override { raise_deferred_checks(wait); }

 private:
  template <typename T>
  static std::unique_ptr<backend::Attention<T>> make_attention(const detail::Problem& p,
                                                               const T* w) {
    // Pieces of a longer sequence, and token-level causal masking off the
    // tensor cores: no kernels here.
    if (p.first_block != 0 || p.mixing_blocks != p.blocks) return nullptr;
    auto kernels = std::make_unique<CudaAttention<T>>(p, w);
    if (p.causal && !kernels->on_tensor_cores()) return nullptr;
    return kernels;
  }
  // Where the 16-bit kernels do not apply, the API refuses the problem or
  // runs it in float on widened copies (make_attention says which).
  template <typename H>
  static std::unique_ptr<backend::HalfAttention<H>> make_half_attention(const detail::Problem& p,
                                                                        const float* w) {
    auto kernels = std::make_unique<CudaTensorCoreAttention<H>>(p, w);
    if (!kernels->fits()) return nullptr;
    return kernels;
  }

  CudaMemory memory_;
};

// The runtime's answer to "is there a device", asked once.
struct Presence {
  bool present = false;
  std::string reason;
};

const Presence& presence() {
  static const Presence answer = [] {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      cudaGetLastError();  // clears the error, which is not sticky
      return Presence{false, std::string("cudaGetDeviceCount: ") + cudaGetErrorString(status)};
    }
    if (count == 0) return Presence{false, "cudaGetDeviceCount found 0 devices"};
    return Presence{true, ""};
  }();
  return answer;
}

}  // namespace
}  // namespace mhla::cuda

namespace mhla::backend {

const Backend& cuda_backend() {
  static const cuda::CudaBackend backend;
  return backend;
}

bool cuda_device_present() { return cuda::presence().present; }

std::string cuda_absence_reason() { return cuda::presence().reason; }

}  // namespace mhla::backend
