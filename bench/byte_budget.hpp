#pragma once
// The byte and FLOP budget of the bfloat16 CUDA kernels' design
// (docs/cuda.md#the-byte-budget): what each kernel must read and write, and
// compute, at one shape, when every kernel reads its operands once. The
// design it prices:
// - tokens (q, k, v, o and their gradients) in bfloat16;
// - summaries S_b and mixed summaries S~_b in bfloat16 rows (2 Dk Dv bytes a
//   block and head), their normalisers z_b, z~_b in float32 (4 Dk); their
//   gradients likewise (sums in float32, rounded once as they are written);
// - forward: summaries (k, v in; S, z out), mix (S in; S~ out; W), read-out
//   (q and S~ in, o out; causal also reads its own block's k and v);
// - backward, which recomputes the forward's state (the summaries and the
//   mix again, as the API's forward saves nothing for these kernels): the
//   query side (q, grad_o, S~ in; grad_q and grad S~ out; causal: its block's
//   k, v), the mix's transpose (grad S~ in, grad S out), the weight gradient
//   (grad S~, S in), the key and value side (k, v, grad S in; grad_k, grad_v
//   out; causal: its block's q, grad_o).
// Plain arithmetic, so that CI checks the budget without a GPU
// (mhla_cuda_byte_budget) and the CUDA benchmark prints it beside its times.
#include <cstdint>
#include <string>
#include <vector>

namespace mhla::bench {

struct BudgetShape {
  std::string name;
  int64_t tokens, heads, d, blocks;  // B = 1, Dk = Dv = d
  bool causal = false;
};

struct KernelBudget {
  std::string name;
  double bytes, flops;
};

struct Budget {
  std::vector<KernelBudget> forward, backward;
  double floor_bytes;  // q, k, v read and o written once, in bfloat16
};

// The four shapes the targets are set at (docs/cuda.md).
inline std::vector<BudgetShape> budget_shapes() {
  return {{"4096 tokens, 8 heads of 64, M = 64", 4096, 8, 64, 64},
          {"65536 tokens, 8 heads of 64, M = 256", 65536, 8, 64, 256},
          {"video 21x30x50, 12 heads of 128, M = 210", 31500, 12, 128, 210},
          {"causal 65536 tokens, 8 heads of 64, M = 256", 65536, 8, 64, 256, true}};
}

inline Budget byte_budget(const BudgetShape& s) {
  const double n = double(s.tokens), h = double(s.heads), d = double(s.d), m = double(s.blocks);
  const double block = n / m;              // tokens a block
  const double tokens = n * h * d * 2.0;   // one bfloat16 token tensor
  const double state = m * h * (2.0 * d * d + 4.0 * d);  // S (bf16) and z (fp32), every block
  const double grad_state = state;  // grad S (bf16) and grad z (fp32), every block
  const double w = m * m * 4.0;
  // Causal: each token's own block up to itself, scores and values (half the square).
  const double in_block = s.causal ? 2.0 * n * block * h * d : 0.0;
  const double mix_flops = 2.0 * m * m * h * d * (d + 1.0) * (s.causal ? 0.5 : 1.0);
  Budget b;
  b.floor_bytes = 4.0 * tokens;
  b.forward = {
      {"summaries", 2.0 * tokens + state, 2.0 * n * h * d * (d + 1.0)},
      {"mix", 2.0 * state + w, mix_flops},
      {"read-out", 2.0 * tokens + state + (s.causal ? 2.0 * tokens : 0.0),
       2.0 * n * h * d * (d + 1.0) + in_block},
  };
  b.backward = {
      b.forward[0],
      b.forward[1],
      {"query side", 3.0 * tokens + state + grad_state + (s.causal ? 2.0 * tokens : 0.0),
       4.0 * n * h * d * (d + 1.0) + 2.0 * in_block},
      {"mix transpose", 2.0 * grad_state + w, mix_flops},
      {"weight gradient", grad_state + state + 2.0 * w, mix_flops},
      {"key and value side", 4.0 * tokens + grad_state + (s.causal ? 2.0 * tokens : 0.0),
       4.0 * n * h * d * (d + 1.0) + 2.0 * in_block},
  };
  return b;
}

// The model's rates: a measured bf16 GEMM's 789 TFLOP/s (H100, H200) at half
// efficiency (mma.sync tiles of a few warps), and 3 us a launch.
constexpr double kModelTflops = 789.0, kModelFlopEfficiency = 0.5, kModelLaunchMs = 0.003;

// A kernel's modeled time at `bytes_per_ms`: the longer of its bytes' and its
// FLOPs' time, plus a launch.
inline double modeled_ms(const KernelBudget& k, double bytes_per_ms) {
  const double flops_per_ms = kModelTflops * 1e9 * kModelFlopEfficiency;
  return (k.bytes / bytes_per_ms > k.flops / flops_per_ms ? k.bytes / bytes_per_ms
                                                          : k.flops / flops_per_ms) +
         kModelLaunchMs;
}

inline double total_bytes(const std::vector<KernelBudget>& kernels) {
  double sum = 0;
  for (const KernelBudget& k : kernels) sum += k.bytes;
  return sum;
}

inline double total_flops(const std::vector<KernelBudget>& kernels) {
  double sum = 0;
  for (const KernelBudget& k : kernels) sum += k.flops;
  return sum;
}

}  // namespace mhla::bench
