#pragma once
// What the CUDA benchmarks share: checked runtime calls, random device
// arrays, the copy rate the card measures, the four shapes the GPU targets
// are set at (docs/cuda.md), and their JSON files.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "mhla/mhla.hpp"

namespace mhla::bench {

inline void check(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(status));
  std::exit(1);
}

struct Shape {
  const char* name;
  int64_t heads, d;
  mhla::TokenLayout layout;
  mhla::Masking masking = mhla::Masking::none;
};

// The shapes of the GPU targets, in the order of byte_budget.hpp's budget_shapes().
inline std::vector<Shape> target_shapes() {
  return {
      {"4096 tokens, 8 heads of 64, M = 64", 8, 64, mhla::TokenLayout::sequence(4096, 64)},
      {"65536 tokens, 8 heads of 64, M = 256", 8, 64, mhla::TokenLayout::sequence(65536, 256)},
      {"video 21x30x50, 12 heads of 128, M = 210", 12, 128,
       mhla::TokenLayout::grid3d(21, 30, 50, 1, 15, 10)},
      // Token-level causal masking: the bf16 kernels only (the float ones refuse it).
      {"causal 65536 tokens, 8 heads of 64, M = 256", 8, 64,
       mhla::TokenLayout::sequence(65536, 256), mhla::Masking::causal},
  };
}

// n floats drawn uniformly from [lo, hi).
inline std::vector<float> random_values(int64_t n, float lo, float hi, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> host(static_cast<size_t>(n));
  for (float& x : host) x = dist(rng);
  return host;
}

template <typename T>
inline T* to_device(const std::vector<T>& host) {
  T* device = nullptr;
  check(cudaMalloc(&device, host.size() * sizeof(T)), "cudaMalloc");
  check(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice),
        "cudaMemcpy");
  return device;
}

inline float* random_device_array(int64_t n, float lo, float hi, std::mt19937& rng) {
  return to_device(random_values(n, lo, hi, rng));
}

inline std::vector<mhla::bfloat16> rounded(const std::vector<float>& x) {
  std::vector<mhla::bfloat16> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = mhla::to_bfloat16(x[i]);
  return out;
}

inline std::vector<mhla::float16> rounded_to_float16(const std::vector<float>& x) {
  std::vector<mhla::float16> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = mhla::to_float16(x[i]);
  return out;
}

// Bytes read plus bytes written per ms by the fastest of 5 device-to-device
// copies of 1 GiB.
inline double copy_bytes_per_ms() {
  const size_t bytes = size_t(1) << 30;
  void *from = nullptr, *to = nullptr;
  check(cudaMalloc(&from, bytes), "cudaMalloc");
  check(cudaMalloc(&to, bytes), "cudaMalloc");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  float best = INFINITY;
  for (int r = 0; r < 6; ++r) {
    check(cudaEventRecord(start), "cudaEventRecord");
    check(cudaMemcpy(to, from, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy");
    check(cudaEventRecord(stop), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    if (r > 0) best = std::min(best, ms);  // the first copy warms up
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(from);
  cudaFree(to);
  return 2.0 * double(bytes) / best;
}

// Writes `results`, indented, to `path`; throws naming the file if it cannot.
inline void write_json(const std::string& path, const nlohmann::json& results) {
  std::ofstream out(path);
  out << results.dump(2) << '\n';
  if (!out) throw std::runtime_error("cannot write " + path);
}

}  // namespace mhla::bench
