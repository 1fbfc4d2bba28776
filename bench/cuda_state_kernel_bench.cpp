// The bfloat16-state kernels (src/cuda/bf16_state_*.cuh) one by one at the
// shapes of the GPU targets: each
// kernel's median time from CUDA events beside its byte budget
// (byte_budget.hpp) at 70% of the copy rate measured here, printed and
// written as JSON, so that a GPU run says which kernel misses its budget.
//
//   mhla_cuda_state_kernel_bench [repeats = 20] [json = state-kernels.json]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "byte_budget.hpp"
#include "core/validate.hpp"
#include "core/validated_call.hpp"
#include "cuda/bf16_state_backward.cuh"
#include "cuda/bf16_state_forward.cuh"
#include "cuda/bf16_state_mix.cuh"
#include "cuda/bf16_state_plan.hpp"
#include "cuda/kernel_problem_of.hpp"
#include "cuda_bench_support.hpp"

namespace {

using namespace mhla::bench;
using mhla::cuda::Bf16State;
using mhla::cuda::KernelProblem;

template <typename T>
T* device_zeros(int64_t n) {
  T* device = nullptr;
  check(cudaMalloc(&device, size_t(n) * sizeof(T)), "cudaMalloc");
  check(cudaMemset(device, 0, size_t(n) * sizeof(T)), "cudaMemset");
  return device;
}

// The median over `repeats` launches (after one to warm up) of the time
// between two events around `launch`.
double median_event_ms(int repeats, const std::function<void()>& launch) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  launch();
  std::vector<float> ms;
  for (int r = 0; r < repeats; ++r) {
    check(cudaEventRecord(start), "cudaEventRecord");
    launch();
    check(cudaEventRecord(stop), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float elapsed = 0;
    check(cudaEventElapsedTime(&elapsed, start, stop), "cudaEventElapsedTime");
    ms.push_back(elapsed);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// One shape's arrays on the device and the kernels' view of its problem.
class StateKernelCall {
 public:
  StateKernelCall(const Shape& s, std::mt19937& rng)
      : n_(s.layout.num_tokens()), m_(s.layout.num_blocks()), elements_(n_ * s.heads * s.d),
        host_w_(random_values(m_ * m_, 0.05f, 1, rng)), options_(options_of(s)),
        host_tokens_(size_t(elements_), 0.5f),
        call_(mhla::detail::validate_mhla("mhla_cuda_state_kernel_bench", options_,
                                          host_view(host_tokens_, s), host_view(host_tokens_, s),
                                          host_view(host_tokens_, s),
                                          mhla::TensorView<const float>{host_w_.data(), {m_, m_}}),
              options_.layout),
        arrays_(mhla::cuda::block_arrays(call_.problem().table, n_)),
        block_arrays_(to_device(arrays_.values)),
        p_(mhla::cuda::kernel_problem(call_.problem(), block_arrays_, arrays_.largest_block)) {
    for (uint16_t** x : {&q_, &k_, &v_, &grad_o_})
      *x = reinterpret_cast<uint16_t*>(to_device(rounded(random_values(elements_, -1, 1, rng))));
    for (uint16_t** x : {&o_, &grad_q_, &grad_k_, &grad_v_}) *x = device_zeros<uint16_t>(elements_);
    w_ = to_device(host_w_);
    grad_w_ = device_zeros<float>(m_ * m_);
    flag_ = device_zeros<int>(1);
    scratch_ = device_zeros<float>(mhla::cuda::bf16_state_backward_scratch(p_));
    owned_ = {block_arrays_, q_, k_, v_, grad_o_, o_, grad_q_, grad_k_, grad_v_, w_, grad_w_, flag_,
              scratch_};
    state_ = state_arrays(), grads_ = state_arrays();
    // Token-level causal: the tokens' terms and W's diagonal part, after the
    // weight gradient's scratch (as bf16_state_backward lays them out).
    if (p_.causal) {
      terms_ = scratch_ + mhla::cuda::bf16_state_weight_scratch(p_);
      diagonal_ = terms_ + 2 * n_ * s.heads;
    }
  }
  ~StateKernelCall() {
    for (void* x : owned_) cudaFree(x);
  }
  StateKernelCall(const StateKernelCall&) = delete;
  StateKernelCall& operator=(const StateKernelCall&) = delete;

  bool fits() const {
    return mhla::cuda::bf16_state_forward_fits(p_, q_, k_, v_, o_) &&
           mhla::cuda::bf16_state_backward_fits(p_, q_, k_, v_, grad_o_, grad_q_, grad_k_, grad_v_);
  }

  // Each kernel the forward and the backward launch, by the budget's names
  // (the backward's recomputed summaries and mix are the forward's kernels).
  std::vector<std::pair<std::string, std::function<void()>>> kernels() {
    using namespace mhla::cuda;
    return {
        {"summaries", [this] { bf16_state_summaries(p_, k_, v_, state_, nullptr); }},
        {"mix", [this] { mix(false, state_, state_); }},
        {"read-out", [this] { bf16_state_read_out(p_, q_, k_, v_, w_, state_, o_, flag_, nullptr); }},
        {"query side",
         [this] {
           bf16_state_query_side(p_, q_, k_, v_, w_, grad_o_, state_, grads_, grad_q_, terms_, flag_,
                                 nullptr);
         }},
        {"mix transpose", [this] { mix(true, grads_, grads_); }},
        {"weight gradient",
         [this] {
           bf16_state_weight_gradient(p_, grads_.mixed, grads_.mixed_normalisers, state_.summaries,
                                      state_.normalisers, diagonal_, grad_w_, scratch_, flag_,
                                      nullptr);
         }},
        {"key and value side",
         [this] {
           bf16_state_key_value_side(p_, q_, k_, v_, w_, grad_o_, grads_, terms_, grad_k_, grad_v_,
                                     diagonal_, flag_, nullptr);
         }},
    };
  }

 private:
  static mhla::Options options_of(const Shape& s) {
    mhla::Options options;
    options.layout = s.layout;
    options.masking = s.masking;
    return options;
  }
  mhla::TensorView<const float> host_view(const std::vector<float>& x, const Shape& s) const {
    return {x.data(), {1, n_, s.heads, int64_t(x.size()) / (n_ * s.heads)}};
  }
  Bf16State state_arrays() {
    const mhla::cuda::state::StateSizes sizes = mhla::cuda::state::state_sizes(p_);
    auto* rows = device_zeros<uint16_t>(2 * sizes.summaries);
    auto* floats = device_zeros<float>(2 * sizes.normalisers);
    owned_.push_back(rows);
    owned_.push_back(floats);
    return {rows, floats, rows + sizes.summaries, floats + sizes.normalisers};
  }
  // S~ = W S (or grad S = W^T grad S~): the state kernels' mix, both of its launches.
  void mix(bool transposed, const Bf16State& from, const Bf16State& to) {
    if (transposed)
      mhla::cuda::bf16_state_mix(p_, w_, true, from.mixed, from.mixed_normalisers, to.summaries,
                                 to.normalisers, nullptr);
    else
      mhla::cuda::bf16_state_mix(p_, w_, false, from.summaries, from.normalisers, to.mixed,
                                 to.mixed_normalisers, nullptr);
  }

  int64_t n_, m_, elements_;
  std::vector<float> host_w_;
  mhla::Options options_;
  std::vector<float> host_tokens_;  // shapes for validation; the values are not read
  mhla::detail::ValidatedCall call_;
  mhla::cuda::BlockArrays arrays_;
  int64_t* block_arrays_;
  KernelProblem p_;
  uint16_t *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *grad_o_ = nullptr, *o_ = nullptr,
           *grad_q_ = nullptr, *grad_k_ = nullptr, *grad_v_ = nullptr;
  float *w_ = nullptr, *grad_w_ = nullptr, *scratch_ = nullptr, *terms_ = nullptr,
        *diagonal_ = nullptr;
  int* flag_ = nullptr;
  Bf16State state_{}, grads_{};
  std::vector<void*> owned_;
};

const KernelBudget& budget_of(const Budget& b, bool forward, const std::string& name) {
  for (const KernelBudget& k : forward ? b.forward : b.backward)
    if (k.name == name) return k;
  throw std::runtime_error("no budget for the kernel " + name);
}

}  // namespace

int main(int argc, char** argv) try {
  const int repeats = argc > 1 ? std::max(1, std::atoi(argv[1])) : 20;
  const std::string json_path = argc > 2 ? argv[2] : "state-kernels.json";
  const double copy_rate = copy_bytes_per_ms(), budget_rate = 0.7 * copy_rate;
  cudaDeviceProp props{};
  check(cudaGetDeviceProperties(&props, 0), "cudaGetDeviceProperties");
  std::printf("device: %s; copy rate %.0f GB/s; budgets at 70%% of it; median of %d (CUDA events)\n",
              props.name, copy_rate / 1e6, repeats);
  nlohmann::json results = {{"device", props.name},
                            {"copy_gb_per_s", copy_rate / 1e6},
                            {"repeats", repeats},
                            {"shapes", nlohmann::json::array()}};
  std::mt19937 rng(1);
  const std::vector<Shape> shapes = target_shapes();
  const std::vector<BudgetShape> budget_shapes = mhla::bench::budget_shapes();
  for (size_t i = 0; i < shapes.size(); ++i) {
    if (budget_shapes[i].tokens != shapes[i].layout.num_tokens())
      throw std::runtime_error("the target shapes and the budget's are listed in different orders");
    StateKernelCall call(shapes[i], rng);
    if (!call.fits()) throw std::runtime_error(std::string("the state kernels refuse ") + shapes[i].name);
    const Budget budget = byte_budget(budget_shapes[i]);
    std::printf("\n%s\n  %-20s %10s %10s %8s %12s\n", shapes[i].name, "kernel", "ms", "budget ms",
                "ratio", "GB/s");
    nlohmann::json kernels = nlohmann::json::array();
    double forward_ms = 0, backward_ms = 0, forward_budget = 0, backward_budget = 0;
    for (const auto& [name, launch] : call.kernels()) {
      const bool forward = name == "summaries" || name == "mix" || name == "read-out";
      const KernelBudget& k = budget_of(budget, forward, name);
      const double ms = median_event_ms(repeats, launch), model = modeled_ms(k, budget_rate);
      // The backward recomputes the summaries and the mix: they count in both passes.
      const int in_backward = name == "read-out" ? 0 : 1;
      forward_ms += forward ? ms : 0;
      forward_budget += forward ? model : 0;
      backward_ms += in_backward * ms;
      backward_budget += in_backward * model;
      std::printf("  %-20s %10.4f %10.4f %8.2f %12.0f\n", name.c_str(), ms, model, ms / model,
                  k.bytes / ms / 1e6);
      kernels.push_back({{"kernel", name}, {"ms", ms}, {"budget_ms", model}, {"bytes", k.bytes}});
    }
    const double floor_ms = budget.floor_bytes / copy_rate;
    std::printf("  kernels' sum: forward %.4f ms (%.1fx budget, %.1fx floor), forward+backward "
                "%.4f ms (%.1fx budget, %.1fx floor)\n",
                forward_ms, forward_ms / forward_budget, forward_ms / floor_ms,
                forward_ms + backward_ms, (forward_ms + backward_ms) / (forward_budget + backward_budget),
                (forward_ms + backward_ms) / floor_ms);
    results["shapes"].push_back({{"shape", shapes[i].name},
                                 {"kernels", kernels},
                                 {"forward_ms", forward_ms},
                                 {"forward_backward_ms", forward_ms + backward_ms},
                                 {"floor_ms", floor_ms}});
  }
  write_json(json_path, results);
  std::printf("\nwrote %s\n", json_path.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
