// The CUDA backend: the operator's phases as the one-thread-per-result
// kernels of cuda/thread_per_result_kernels.cuh, on the default stream, with
// per-thread device scratch; the bfloat16 operator on tensor cores
// (cuda/bf16_*_kernels.cuh), token-level causal masking included.
// Token-level causal masking in float and double, the decoder's step and the
// softmax baseline are not implemented on CUDA and are refused by name.
#include <cuda_runtime.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.hpp"
#include "cuda/bf16_backward_kernels.cuh"
#include "cuda/bf16_forward_kernels.cuh"
#include "cuda/bf16_mix_kernels.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/elementwise.cuh"
#include "cuda/thread_per_result_kernels.cuh"

namespace mhla::cuda {
namespace {

using backend::Scratch;

[[noreturn]] void unsupported(const std::string& what,
                              const std::string& instead = "pass CPU tensors") {
  throw Error("mhla (CUDA backend): " + what + " is not implemented on CUDA; " + instead);
}

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
enum class Own { grad_mixed, grad_summaries, token_terms, mix_backward, diagonal, flag, count };
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

// A layout's block arrays on the device: block_tokens [N] (each block's
// tokens in order), block_start [M + 1], token_block [N].
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
    const int64_t m = table.blocks;
    std::vector<int64_t> host(size_t(2 * n + m + 1));
    int64_t* block_tokens = host.data();
    int64_t* block_start = block_tokens + n;
    int64_t* token_block = block_start + m + 1;
    int64_t next = 0;
    auto device = std::make_shared<DeviceBlockArrays>();
    for (int64_t b = 0; b < m; ++b) {
      block_start[b] = next;
      table.for_each_run(b, [&](int64_t first, int64_t length) {
        for (int64_t t = first; t < first + length; ++t) {
          block_tokens[next++] = t;
          token_block[t] = b;
        }
      });
      device->largest_block = std::max(device->largest_block, next - block_start[b]);
    }
    block_start[m] = next;
    device->arrays = DeviceBuffer(host.size() * sizeof(int64_t));
    upload(host, static_cast<int64_t*>(device->arrays.data()));
    return device;
  }

  std::vector<Entry> entries_;
};

thread_local BlockArrayCache block_arrays;

// The block geometry of a validated problem as device arrays, and the
// kernels' view of the problem.
class Geometry {
 public:
  explicit Geometry(const detail::Problem& p) : arrays_(block_arrays.get(p.table, p.dims.tokens)) {
    const int64_t n = p.dims.tokens, m = p.table.blocks;
    const auto* device = static_cast<const int64_t*>(arrays_->arrays.data());
    problem_.largest_block = arrays_->largest_block;
    problem_.batch = p.dims.batch;
    problem_.tokens = n;
    problem_.heads = p.dims.heads;
    problem_.dk = p.dims.dk;
    problem_.dv = p.dims.dv;
    problem_.blocks = m;
    problem_.block_tokens = device;
    problem_.block_start = device + n;
    problem_.token_block = device + n + m + 1;
    problem_.first_block = p.first_block;
    problem_.mixing_blocks = p.mixing_blocks;
    problem_.w_stride = p.w_stride;
    problem_.per_head = p.per_head_mixing;
    problem_.toeplitz = p.toeplitz;
    problem_.lower_triangular = p.lower_triangular();
    problem_.causal = p.causal;
    problem_.toeplitz_length = p.toeplitz_length;
    problem_.phi = p.phi;
    problem_.normalize = p.normalize;
    problem_.eps = p.eps;
    problem_.scale = p.scale;
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

// The flag the kernels raise on a non-finite result: cleared before the
// kernels run, read back after them (the read waits for them to finish).
class NonFiniteFlag {
 public:
  NonFiniteFlag() : flag_(own<int>(Own::flag, 1)) {
    check(cudaMemsetAsync(flag_, 0, sizeof(int), nullptr), "cudaMemsetAsync");
  }
  int* device() const { return flag_; }
  bool raised() const {
    int raised = 0;
    check(cudaMemcpy(&raised, flag_, sizeof(int), cudaMemcpyDeviceToHost),
          "cudaMemcpy (device to host)");
    return raised != 0;
  }

 private:
  int* flag_;
};

template <typename T>
class CudaAttention final : public backend::Attention<T> {
 public:
  CudaAttention(const detail::Problem& p, const T* w) : geometry_(p), w_(w) {}

  bool forward(const T* q, const T* k, const T* v, T* o, T* saved_summaries,
               T* saved_mixed) const override {
    T* s = saved_summaries ? saved_summaries : api_slot<T>(Scratch::summaries, summary_elements());
    T* m = saved_mixed ? saved_mixed : api_slot<T>(Scratch::mixed, summary_elements());
    summaries(k, v, s);
    mix(s, m);
    return outputs(q, k, v, m, o);
  }

  bool backward(const T* q, const T* k, const T* v, const T* grad_o, T* grad_q, T* grad_k,
                T* grad_v, T* grad_w, const T* saved_summaries,
                const T* saved_mixed) const override {
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
    const NonFiniteFlag flag;
    T* grad_mixed = own<T>(Own::grad_mixed, summary_elements());
    T* grad_summaries = own<T>(Own::grad_summaries, summary_elements());
    run_output_gradients(q, grad_o, m, grad_mixed, grad_q, flag.device());
    cuda::mix_backward(p(), w_, s, grad_mixed, grad_summaries, grad_w, flag.device(), nullptr);
    cuda::key_value_gradients(p(), k, v, grad_summaries, grad_k, grad_v, flag.device(), nullptr);
    return !flag.raised();
  }

  void summaries(const T* k, const T* v, T* summaries) const override {
    cuda::summaries(p(), k, v, summaries, nullptr);
  }
  void mix(const T* summaries, T* mixed) const override {
    cuda::mix(p(), w_, summaries, mixed, nullptr);
  }
  void mix_backward(const T* grad_mixed, const T* summaries, T* grad_summaries,
                    T* grad_w) const override {
    const NonFiniteFlag flag;
    cuda::mix_backward(p(), w_, summaries, grad_mixed, grad_summaries, grad_w, flag.device(),
                       nullptr);
  }
  bool outputs(const T* q, const T*, const T*, const T* mixed, T* o) const override {
    const NonFiniteFlag flag;
    cuda::outputs(p(), q, mixed, o, flag.device(), nullptr);
    return !flag.raised();
  }
  bool output_gradients(const T* q, const T*, const T*, const T* grad_o, const T* mixed,
                        T* grad_mixed, T* grad_q, T*, T*, T*) const override {
    const NonFiniteFlag flag;
    run_output_gradients(q, grad_o, mixed, grad_mixed, grad_q, flag.device());
    return !flag.raised();
  }
  void key_value_gradients(const T* k, const T* v, const T* grad_summaries, T* grad_k,
                           T* grad_v) const override {
    const NonFiniteFlag flag;
    cuda::key_value_gradients(p(), k, v, grad_summaries, grad_k, grad_v, flag.device(), nullptr);
  }

 private:
  const KernelProblem& p() const { return geometry_.problem(); }
  int64_t summary_elements() const { return geometry_.summary_elements(); }
  void run_output_gradients(const T* q, const T* grad_o, const T* mixed, T* grad_mixed, T* grad_q,
                            int* flag) const {
    T* terms = own<T>(Own::token_terms, 2 * p().batch * p().tokens * p().heads);
    cuda::output_gradients(p(), q, mixed, grad_o, grad_q, grad_mixed, terms, flag, nullptr);
  }

  const Geometry geometry_;
  const T* w_;
};

// The bfloat16 operator on tensor cores: the forward's summaries, mix and
// outputs; the backward's query gradients (with the per-token terms), the
// mixed summaries' gradient, the mix's backward and the key and value gradients.
class CudaBf16Attention final : public backend::Bf16Attention {
 public:
  CudaBf16Attention(const detail::Problem& p, const float* w) : geometry_(p), w_(w) {}
  bool fits() const { return bf16_kernels_fit(geometry_.problem()); }

  bool forward(const bfloat16* q, const bfloat16* k, const bfloat16* v, bfloat16* o,
               float* saved_summaries, float* saved_mixed) const override {
    const KernelProblem& p = geometry_.problem();
    const int64_t elements = geometry_.summary_elements();
    float* s = saved_summaries ? saved_summaries : api_slot<float>(Scratch::summaries, elements);
    float* m = saved_mixed ? saved_mixed : api_slot<float>(Scratch::mixed, elements);
    bf16_summaries(p, bits(k), bits(v), s, nullptr);
    bf16_mix(p, w_, s, m, nullptr);
    const NonFiniteFlag flag;
    bf16_outputs(p, bits(q), bits(k), bits(v), w_, m, bits(o), flag.device(), nullptr);
    return !flag.raised();
  }
  bool backward(const bfloat16* q, const bfloat16* k, const bfloat16* v, const bfloat16* grad_o,
                bfloat16* grad_q, bfloat16* grad_k, bfloat16* grad_v, float* grad_w,
                const float* saved_summaries, const float* saved_mixed) const override {
    const KernelProblem& p = geometry_.problem();
    const int64_t elements = geometry_.summary_elements();
    const float* s = saved_summaries;
    if (s == nullptr) {
      float* fresh = api_slot<float>(Scratch::summaries, elements);
      bf16_summaries(p, bits(k), bits(v), fresh, nullptr);
      s = fresh;
    }
    const float* m = saved_mixed;
    if (m == nullptr) {
      float* fresh = api_slot<float>(Scratch::mixed, elements);
      bf16_mix(p, w_, s, fresh, nullptr);
      m = fresh;
    }
    const NonFiniteFlag flag;
    float* terms = own<float>(Own::token_terms, 2 * p.batch * p.tokens * p.heads);
    float* grad_mixed = own<float>(Own::grad_mixed, elements);
    float* grad_summaries = own<float>(Own::grad_summaries, elements);
    float* mix_scratch = own<float>(Own::mix_backward, bf16_mix_backward_scratch(p));
    float* diagonal = p.causal ? own<float>(Own::diagonal, bf16_diagonal_terms(p)) : nullptr;
    bf16_query_gradients(p, bits(q), bits(k), bits(v), bits(grad_o), w_, m, bits(grad_q), terms,
                         diagonal, flag.device(), nullptr);
    bf16_mixed_gradients(p, bits(q), bits(grad_o), terms, grad_mixed, nullptr);
    bf16_mix_backward(p, w_, s, grad_mixed, diagonal, grad_summaries, grad_w, mix_scratch,
                      flag.device(), nullptr);
    bf16_key_value_gradients(p, bits(q), bits(k), bits(v), bits(grad_o), w_, terms, grad_summaries,
                             bits(grad_k), bits(grad_v), flag.device(), nullptr);
    return !flag.raised();
  }

 private:
  static const uint16_t* bits(const bfloat16* x) { return reinterpret_cast<const uint16_t*>(x); }
  static uint16_t* bits(bfloat16* x) { return reinterpret_cast<uint16_t*>(x); }

  const Geometry geometry_;
  const float* w_;
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
  std::unique_ptr<backend::Bf16Attention> bf16_attention(const detail::Problem& p,
                                                         const float* w) const override {
    // Where the bfloat16 kernels do not apply, the API refuses the problem or
    // runs it in float on widened copies (make_attention says which).
    auto kernels = std::make_unique<CudaBf16Attention>(p, w);
    if (!kernels->fits()) return nullptr;
    return kernels;
  }
  std::unique_ptr<backend::DecodeState> decode_state(int64_t, int64_t) const override {
    unsupported("the streaming decoder");
  }
  void softmax_forward(const backend::SoftmaxProblem&, const float*, const float*, const float*,
                       float*, float*) const override {
    unsupported("softmax attention");
  }
  void softmax_forward(const backend::SoftmaxProblem&, const double*, const double*, const double*,
                       double*, double*) const override {
    unsupported("softmax attention");
  }
  void softmax_backward(const backend::SoftmaxProblem&, const float*, const float*, const float*,
                        const float*, const float*, const float*, float*, float*,
                        float*) const override {
    unsupported("softmax attention");
  }
  void softmax_backward(const backend::SoftmaxProblem&, const double*, const double*, const double*,
                        const double*, const double*, const double*, double*, double*,
                        double*) const override {
    unsupported("softmax attention");
  }

  void* scratch(Scratch slot, size_t bytes) const override {
    return api_scratch.get(size_t(slot), bytes);
  }
  void release_scratch() const override {
    api_scratch.release();
    own_scratch.release();
    block_arrays.clear();
  }

  void add(const float* from, int64_t n, float* to) const override {
    cuda::add(from, n, to, nullptr);
  }
  void add(const double* from, int64_t n, double* to) const override {
    cuda::add(from, n, to, nullptr);
  }
  void copy(const float* from, int64_t n, float* to) const override { copy_bytes(from, n, to); }
  void copy(const double* from, int64_t n, double* to) const override { copy_bytes(from, n, to); }
  void zero(float* to, int64_t n) const override { zero_bytes(to, n); }
  void zero(double* to, int64_t n) const override { zero_bytes(to, n); }
  void widen(const bfloat16* from, int64_t n, float* to) const override {
    cuda::widen(reinterpret_cast<const uint16_t*>(from), n, to, nullptr);
  }
  void narrow(const float* from, int64_t n, bfloat16* to) const override {
    cuda::narrow(from, n, reinterpret_cast<uint16_t*>(to), nullptr);
  }
  void to_host(const void* from, size_t bytes, void* to) const override {
    check(cudaMemcpy(to, from, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (device to host)");
  }

 private:
  template <typename T>
  static std::unique_ptr<backend::Attention<T>> make_attention(const detail::Problem& p,
                                                               const T* w) {
    if (p.causal)
      unsupported("token-level causal masking (Masking::causal)",
                  "use Masking::block_causal, or pass CPU tensors");
    if (p.first_block != 0 || p.mixing_blocks != p.blocks)
      unsupported("a piece of a longer sequence (forward_piece, packed batches)");
    return std::make_unique<CudaAttention<T>>(p, w);
  }
  template <typename T>
  static void copy_bytes(const T* from, int64_t n, T* to) {
    check(cudaMemcpyAsync(to, from, size_t(n) * sizeof(T), cudaMemcpyDeviceToDevice, nullptr),
          "cudaMemcpyAsync (device to device)");
  }
  template <typename T>
  static void zero_bytes(T* to, int64_t n) {
    check(cudaMemsetAsync(to, 0, size_t(n) * sizeof(T), nullptr), "cudaMemsetAsync");
  }
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
