// The CUDA backend's operator at the shapes of the GPU anchors (docs/cuda.md):
// median forward and forward+backward times in float, and in bfloat16 (on
// tensor cores; float32 and float16 on the same kernels below each row),
// next to the two floors
// of each shape: the bytes the forward must move (read q, k, v; write o) over
// the card's copy rate, and its FLOPs over the card's dense bf16 rate.
//
//   mhla_cuda_operator_bench [repeats = 5] [json = cuda-operator.json]
//
// The copy rate is measured here (a 1 GiB device-to-device copy, bytes read
// plus bytes written); the bf16 GEMM rate is an H100's or H200's as measured
// on one (789 TFLOP/s; the two share their tensor cores): pass another with
// MHLA_GEMM_TFLOPS. Below each shape's row: the kernels' byte budget
// (byte_budget.hpp) at 70% of the measured copy rate, pass by pass, beside
// the measured bf16 times. Every time is also written as JSON.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "byte_budget.hpp"
#include "cuda_bench_support.hpp"
#include "mhla/mhla.hpp"

namespace {

using mhla::Device;
using mhla::TensorView;
using namespace mhla::bench;

// A time in ms, or "-" where the kernels do not take the shape.
std::string cell(double ms) {
  if (std::isnan(ms)) return "-";
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", ms);
  return text;
}

// The same for the JSON file: null where the kernels do not take the shape.
nlohmann::json json_ms(double ms) { return std::isnan(ms) ? nlohmann::json() : nlohmann::json(ms); }

template <typename Fn>
double median_ms(int repeats, Fn&& fn) {
  fn();  // warm-up: allocations of scratch, module load
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    const auto start = std::chrono::steady_clock::now();
    fn();
    check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

double env_or(const char* name, double fallback) {
  const char* value = std::getenv(name);
  return value ? std::atof(value) : fallback;
}

}  // namespace

int main(int argc, char** argv) try {
  const int repeats = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  const std::string json_path = argc > 2 ? argv[2] : "cuda-operator.json";
  const double copy_rate = copy_bytes_per_ms();
  const double flops_per_ms = env_or("MHLA_GEMM_TFLOPS", 789.0) * 1e9;
  const std::vector<Shape> shapes = target_shapes();
  cudaDeviceProp props{};
  check(cudaGetDeviceProperties(&props, 0), "cudaGetDeviceProperties");
  std::printf(
      "device: %s; float32 one thread per result, bf16 on tensor cores; "
      "median of %d; copy rate %.0f GB/s, bf16 GEMM rate %.0f TFLOP/s\n",
      props.name, repeats, copy_rate / 1e6, flops_per_ms / 1e9);
  std::printf("%-44s %12s %12s %12s %16s %14s %14s\n", "shape", "fwd ms", "fwd+bwd ms",
              "bf16 fwd ms", "bf16 fwd+bwd ms", "bytes floor ms", "bf16 flop floor ms");
  nlohmann::json results = {{"device", props.name},
                            {"copy_gb_per_s", copy_rate / 1e6},
                            {"gemm_tflops", flops_per_ms / 1e9},
                            {"repeats", repeats},
                            {"shapes", nlohmann::json::array()}};
  std::mt19937 rng(1);
  const std::vector<mhla::bench::BudgetShape> budget_shapes = mhla::bench::budget_shapes();
  for (size_t shape_index = 0; shape_index < shapes.size(); ++shape_index) {
    const Shape& s = shapes[shape_index];
    const int64_t n = s.layout.num_tokens(), m = s.layout.num_blocks();
    const std::vector<int64_t> shape = {1, n, s.heads, s.d}, w_shape = {m, m};
    const int64_t elements = n * s.heads * s.d;
    const std::vector<float> hq = random_values(elements, -1, 1, rng),
                             hk = random_values(elements, -1, 1, rng),
                             hv = random_values(elements, -1, 1, rng);
    float *q = to_device(hq), *k = to_device(hk), *v = to_device(hv);
    mhla::bfloat16 *bq = to_device(rounded(hq)), *bk = to_device(rounded(hk)),
                   *bv = to_device(rounded(hv)), *bo = to_device(rounded(hv)),
                   *bgo = to_device(rounded(hq)), *bgq = to_device(rounded(hq)),
                   *bgk = to_device(rounded(hq)), *bgv = to_device(rounded(hq));
    float* grad_o = random_device_array(elements, -1, 1, rng);
    float* w = random_device_array(m * m, 0, 1, rng);
    float *o = nullptr, *gq = nullptr, *gk = nullptr, *gv = nullptr, *gw = nullptr;
    for (float** p : {&o, &gq, &gk, &gv})
      check(cudaMalloc(p, size_t(elements) * sizeof(float)), "cudaMalloc");
    check(cudaMalloc(&gw, size_t(m * m) * sizeof(float)), "cudaMalloc");
    mhla::Options options;
    options.layout = s.layout;
    options.masking = s.masking;
    const bool float_kernels = s.masking != mhla::Masking::causal;
    const TensorView<const float> cq{q, shape, Device::cuda}, ck{k, shape, Device::cuda},
        cv{v, shape, Device::cuda}, cw{w, w_shape, Device::cuda}, cg{grad_o, shape, Device::cuda},
        co{o, shape, Device::cuda};
    const auto run_forward = [&] {
      mhla::forward<float>(options, cq, ck, cv, cw, {o, shape, Device::cuda});
    };
    const auto run_forward_backward = [&] {
      run_forward();
      mhla::backward<float>(options, cq, ck, cv, cw, co, cg, {gq, shape, Device::cuda},
                            {gk, shape, Device::cuda}, {gv, shape, Device::cuda},
                            {gw, w_shape, Device::cuda});
    };
    const double fwd = float_kernels ? median_ms(repeats, run_forward) : NAN;
    const double fwd_bwd = float_kernels ? median_ms(repeats, run_forward_backward) : NAN;
    // float32 on the tensor-core kernels (operands split into bfloat16 halves).
    options.cuda.float32_tensor_cores = true;
    const double split_fwd = median_ms(repeats, run_forward);
    const double split_fwd_bwd = median_ms(repeats, run_forward_backward);
    options.cuda.float32_tensor_cores = false;
    const auto bf16 = [&](mhla::bfloat16* x) {
      return TensorView<const mhla::bfloat16>{x, shape, Device::cuda};
    };
    const auto run_bf16_forward = [&] {
      mhla::forward(options, bf16(bq), bf16(bk), bf16(bv), cw,
                    TensorView<mhla::bfloat16>{bo, shape, Device::cuda});
    };
    const double bf16_fwd = median_ms(repeats, run_bf16_forward);
    // Backward without saved arrays, as in the float column: the kernels
    // recompute the summaries and their mix.
    const auto run_bf16_forward_backward = [&] {
      run_bf16_forward();
      mhla::backward(options, bf16(bq), bf16(bk), bf16(bv), cw, bf16(bo), bf16(bgo),
                     TensorView<mhla::bfloat16>{bgq, shape, Device::cuda},
                     TensorView<mhla::bfloat16>{bgk, shape, Device::cuda},
                     TensorView<mhla::bfloat16>{bgv, shape, Device::cuda},
                     TensorView<float>{gw, w_shape, Device::cuda});
    };
    const double bf16_fwd_bwd = median_ms(repeats, run_bf16_forward_backward);
    // The bfloat16-state kernels (src/cuda/bf16_state_{forward,backward}.cuh).
    options.cuda.bf16_state = true;
    const double state_fwd = median_ms(repeats, run_bf16_forward);
    const double state_fwd_bwd = median_ms(repeats, run_bf16_forward_backward);
    options.cuda.bf16_state = false;
    // float16 tokens on the same kernels (options.cuda.float16_tensor_cores), saving no arrays.
    options.cuda.float16_tensor_cores = true;
    const auto f16_array = [&](const std::vector<float>& x) {
      return to_device(rounded_to_float16(x));
    };
    mhla::float16 *hq16 = f16_array(hq), *hk16 = f16_array(hk), *hv16 = f16_array(hv),
                  *ho16 = f16_array(hv), *hgo16 = f16_array(hq), *hgq16 = f16_array(hq),
                  *hgk16 = f16_array(hq), *hgv16 = f16_array(hq);
    const auto f16 = [&](mhla::float16* x) {
      return TensorView<const mhla::float16>{x, shape, Device::cuda};
    };
    const auto run_f16_forward = [&] {
      mhla::forward(options, f16(hq16), f16(hk16), f16(hv16), cw,
                    TensorView<mhla::float16>{ho16, shape, Device::cuda});
    };
    const auto run_f16_forward_backward = [&] {
      run_f16_forward();
      mhla::backward(options, f16(hq16), f16(hk16), f16(hv16), cw, f16(ho16), f16(hgo16),
                     TensorView<mhla::float16>{hgq16, shape, Device::cuda},
                     TensorView<mhla::float16>{hgk16, shape, Device::cuda},
                     TensorView<mhla::float16>{hgv16, shape, Device::cuda},
                     TensorView<float>{gw, w_shape, Device::cuda});
    };
    const double f16_fwd = median_ms(repeats, run_f16_forward);
    const double f16_fwd_bwd = median_ms(repeats, run_f16_forward_backward);
    options.cuda.bf16_state = true;
    const double f16_state_fwd = median_ms(repeats, run_f16_forward);
    const double f16_state_fwd_bwd = median_ms(repeats, run_f16_forward_backward);
    options.cuda.bf16_state = false;
    options.cuda.float16_tensor_cores = false;
    for (mhla::float16* p : {hq16, hk16, hv16, ho16, hgo16, hgq16, hgk16, hgv16}) cudaFree(p);
    // bf16 tokens: 2 bytes each of q, k, v read and o written.
    const double bytes_floor = 4.0 * double(elements) * 2.0 / copy_rate;
    const mhla::FlopCount flops = mhla::mhla_flops(1, n, s.heads, s.d, s.d, m, s.masking, n / m);
    std::printf("%-44s %12s %12s %12.3f %16.3f %14.3f %14.3f\n", s.name, cell(fwd).c_str(),
                cell(fwd_bwd).c_str(), bf16_fwd, bf16_fwd_bwd, bytes_floor,
                flops.forward / flops_per_ms);
    const mhla::bench::Budget budget = mhla::bench::byte_budget(budget_shapes[shape_index]);
    const double budget_rate = 0.7 * copy_rate;
    std::printf(
        "  budget at 70%% of the copy rate: forward %.3f ms (%.0f MB), backward %.3f ms (%.0f MB); "
        "measured bf16 forward %.1fx, forward+backward %.1fx the budget\n",
        mhla::bench::total_bytes(budget.forward) / budget_rate,
        mhla::bench::total_bytes(budget.forward) / 1e6,
        mhla::bench::total_bytes(budget.backward) / budget_rate,
        mhla::bench::total_bytes(budget.backward) / 1e6,
        bf16_fwd / (mhla::bench::total_bytes(budget.forward) / budget_rate),
        bf16_fwd_bwd / ((mhla::bench::total_bytes(budget.forward) +
                         mhla::bench::total_bytes(budget.backward)) /
                        budget_rate));
    std::printf(
        "  bf16-state forward %.3f ms: %.1fx the budget, %.1fx the bytes floor, %.2fx "
        "the split-operand forward\n",
        state_fwd, state_fwd / (mhla::bench::total_bytes(budget.forward) / budget_rate),
        state_fwd / bytes_floor, state_fwd / bf16_fwd);
    std::printf(
        "  bf16-state forward+backward %.3f ms: %.1fx the budget, %.1fx the bytes floor, "
        "%.2fx the split-operand forward+backward\n",
        state_fwd_bwd,
        state_fwd_bwd / ((mhla::bench::total_bytes(budget.forward) +
                          mhla::bench::total_bytes(budget.backward)) /
                         budget_rate),
        state_fwd_bwd / bytes_floor, state_fwd_bwd / bf16_fwd_bwd);
    std::printf(
        "  float32 on the tensor-core kernels: forward %.3f ms, forward+backward %.3f ms "
        "(one thread per result: %s, %s)\n",
        split_fwd, split_fwd_bwd, cell(fwd).c_str(), cell(fwd_bwd).c_str());
    std::printf(
        "  float16 on the split-operand kernels: forward %.3f ms, forward+backward %.3f ms "
        "(%.2fx, %.2fx bf16's); on the bf16-state kernels: %.3f ms, %.3f ms (%.2fx, "
        "%.2fx bf16's)\n",
        f16_fwd, f16_fwd_bwd, f16_fwd / bf16_fwd, f16_fwd_bwd / bf16_fwd_bwd, f16_state_fwd,
        f16_state_fwd_bwd, f16_state_fwd / state_fwd, f16_state_fwd_bwd / state_fwd_bwd);
    const auto pair = [](double fwd_ms, double fwd_bwd_ms) {
      return nlohmann::json{{"fwd_ms", json_ms(fwd_ms)}, {"fwd_bwd_ms", json_ms(fwd_bwd_ms)}};
    };
    results["shapes"].push_back(
        {{"shape", s.name},
         {"tokens", n},
         {"heads", s.heads},
         {"dim", s.d},
         {"blocks", m},
         {"masking", s.masking == mhla::Masking::causal ? "causal" : "none"},
         {"float32_one_thread_per_result", pair(fwd, fwd_bwd)},
         {"float32_tensor_cores", pair(split_fwd, split_fwd_bwd)},
         {"bfloat16_split_operand", pair(bf16_fwd, bf16_fwd_bwd)},
         {"bfloat16_state", pair(state_fwd, state_fwd_bwd)},
         {"float16_split_operand", pair(f16_fwd, f16_fwd_bwd)},
         {"float16_bfloat16_state", pair(f16_state_fwd, f16_state_fwd_bwd)},
         {"bytes_floor_ms", bytes_floor},
         {"flop_floor_ms", flops.forward / flops_per_ms},
         {"budget_forward_ms", mhla::bench::total_bytes(budget.forward) / budget_rate},
         {"budget_backward_ms", mhla::bench::total_bytes(budget.backward) / budget_rate}});
    for (float* p : {q, k, v, grad_o, w, o, gq, gk, gv, gw}) cudaFree(p);
    for (mhla::bfloat16* p : {bq, bk, bv, bo, bgo, bgq, bgk, bgv}) cudaFree(p);
  }
  write_json(json_path, results);
  std::printf("wrote %s\n", json_path.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "error: %s\n", e.what());
  return 1;
}
