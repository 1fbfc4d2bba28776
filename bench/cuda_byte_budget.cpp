// The bfloat16 CUDA kernels' byte budget (byte_budget.hpp), without a GPU:
// per kernel and shape its bytes and FLOPs, the time they take at a fraction
// of the card's copy rate and of its bf16 GEMM rate, and each pass's total
// against the targets of docs/cuda.md. Exits 1 when a modeled time misses its
// target: then no kernel written to this design can meet it at those rates,
// and the design (not the kernels) must change.
//
//   mhla_cuda_byte_budget [copy GB/s = 4232] [copy efficiency = 0.7]
//
// 4232 GB/s is the copy rate mhla_cuda_operator_bench measured on an H200;
// the bf16 rate is 789 TFLOP/s (a measured GEMM's, as there) at half
// efficiency (mma.sync tiles of a few warps), and every launch costs 3 us.
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "byte_budget.hpp"

namespace {

using mhla::bench::Budget;
using mhla::bench::KernelBudget;

struct Target {
  double forward_ms, both_ms;  // forward, forward+backward
};

// The targets at the four shapes, as multiples of the floor or in ms (the smaller applies).
Target target(size_t shape, double floor_ms) {
  switch (shape) {
    case 0: return {0.05, 0.20};
    case 1: return {3 * floor_ms, 10 * floor_ms};
    case 2: return {3 * floor_ms, 10 * floor_ms};
    default: return {4 * floor_ms, std::min(14 * floor_ms, 2.0)};
  }
}

double pass_ms(const std::vector<KernelBudget>& kernels, double bytes_per_ms) {
  double ms = 0;
  for (const KernelBudget& k : kernels) ms += mhla::bench::modeled_ms(k, bytes_per_ms);
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  const double copy_gbs = argc > 1 ? std::atof(argv[1]) : 4232.0;
  const double efficiency = argc > 2 ? std::atof(argv[2]) : 0.7;
  if (!(copy_gbs > 0) || !(efficiency > 0 && efficiency <= 1)) {
    std::fprintf(stderr, "usage: mhla_cuda_byte_budget [copy GB/s > 0] [copy efficiency in (0, 1]]\n");
    return 2;
  }
  const double copy_bytes_per_ms = copy_gbs * 1e6, bytes_per_ms = efficiency * copy_bytes_per_ms;
  std::printf("copy rate %.0f GB/s at %.0f%%; bf16 %.0f TFLOP/s at %.0f%%; %.0f us a launch\n\n",
              copy_gbs, 100 * efficiency, mhla::bench::kModelTflops,
              100 * mhla::bench::kModelFlopEfficiency, mhla::bench::kModelLaunchMs * 1e3);
  bool met = true;
  const auto shapes = mhla::bench::budget_shapes();
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Budget b = mhla::bench::byte_budget(shapes[i]);
    const double floor_ms = b.floor_bytes / copy_bytes_per_ms;
    std::printf("%s (floor %.3f ms: q, k, v, o in bf16)\n", shapes[i].name.c_str(), floor_ms);
    std::printf("  %-8s %-24s %10s %10s %10s\n", "pass", "kernel", "MB", "GFLOP", "model ms");
    for (const auto& [pass, kernels] : {std::pair{"forward", &b.forward}, {"backward", &b.backward}})
      for (const KernelBudget& k : *kernels)
        std::printf("  %-8s %-24s %10.1f %10.2f %10.3f\n", pass, k.name.c_str(), k.bytes / 1e6,
                    k.flops / 1e9, mhla::bench::modeled_ms(k, bytes_per_ms));
    const Target t = target(i, floor_ms);
    const double forward = pass_ms(b.forward, bytes_per_ms);
    const double both = forward + pass_ms(b.backward, bytes_per_ms);
    std::printf("  forward %.3f ms (%.1fx floor; target %.3f), forward+backward %.3f ms (%.1fx; "
                "target %.3f): %s\n\n",
                forward, forward / floor_ms, t.forward_ms, both, both / floor_ms, t.both_ms,
                forward <= t.forward_ms && both <= t.both_ms ? "within" : "MISSED");
    met = met && forward <= t.forward_ms && both <= t.both_ms;
  }
  std::printf("%s\n", met ? "the design's budget meets every target at these rates"
                          : "the design's budget misses a target at these rates");
  return met ? 0 : 1;
}
