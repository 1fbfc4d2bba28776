#include "cuda/cuda_check.hpp"
#include "cuda/device_helpers.cuh"
#include "cuda/launch.cuh"
#include "cuda/thread_per_result_kernels.cuh"

namespace mhla::cuda {
namespace {

// The (batch, head) slice and the block of the token at a flat row of a token tensor.
struct TokenPlace {
  int64_t bh, block;
};
__device__ TokenPlace place_of(const KernelProblem& p, int64_t row) {
  const int64_t h = row % p.heads, t = row / p.heads % p.tokens, bb = row / (p.heads * p.tokens);
  return {bb * p.heads + h, p.token_block[t]};
}

template <typename T>
__device__ void flag_unless_finite(T x, int* non_finite) {
  if (!isfinite(x)) atomicOr(non_finite, 1);
}

template <typename T>
__global__ void summaries_kernel(KernelProblem p, const T* k, const T* v, T* s) {
  const int64_t x1 = p.dv + 1, total = p.batch * p.heads * p.blocks * p.dk * x1;
  MHLA_GRID_STRIDE(idx, total) {
    const int64_t e = idx % x1, a = idx / x1 % p.dk, b = idx / (x1 * p.dk) % p.blocks,
                  bh = idx / (x1 * p.dk * p.blocks);
    const int64_t bb = bh / p.heads, h = bh % p.heads;
    T acc = 0;
    for (int64_t r = p.block_start[b]; r < p.block_start[b + 1]; ++r) {
      const int64_t row = token_row(p, bb, p.block_tokens[r], h);
      acc += feature(p.phi, k[row * p.dk + a]) * (e < p.dv ? v[row * p.dv + e] : T(1));
    }
    s[idx] = acc;
  }
}

template <typename T>
__global__ void mix_kernel(KernelProblem p, const T* w, const T* s, T* mixed) {
  const int64_t x = p.dk * (p.dv + 1), total = p.batch * p.heads * p.blocks * x;
  MHLA_GRID_STRIDE(idx, total) {
    const int64_t c = idx % x, i = idx / x % p.blocks, bh = idx / (x * p.blocks);
    const int64_t row = p.first_block + i;
    T acc = 0;
    for (int64_t b = 0; b < p.mixing_blocks; ++b)
      if (reads(p, row, b))
        acc += weight(p, w, bh % p.heads, row, b) * s[(bh * p.mixing_blocks + b) * x + c];
    mixed[idx] = acc;
  }
}

// phi(q_t)^T mixed[block of t] at column e (e = Dv: the denominator).
template <typename T>
__device__ T read_column(const KernelProblem& p, const T* q, const T* mixed, int64_t row,
                         int64_t bh, int64_t block, int64_t e) {
  const int64_t x1 = p.dv + 1;
  const T* m = mixed + (bh * p.blocks + block) * p.dk * x1;
  T acc = 0;
  for (int64_t a = 0; a < p.dk; ++a) acc += feature(p.phi, q[row * p.dk + a]) * m[a * x1 + e];
  return acc;
}

template <typename T>
__global__ void outputs_kernel(KernelProblem p, const T* q, const T* mixed, T* o,
                               int* non_finite) {
  const int64_t total = p.batch * p.tokens * p.heads * p.dv;
  MHLA_GRID_STRIDE(idx, total) {
    const int64_t e = idx % p.dv, row = idx / p.dv;
    const auto [bh, block] = place_of(p, row);
    const T y = read_column(p, q, mixed, row, bh, block, e);
    T out = T(p.scale) * y;
    if (p.normalize) {
      const T den = read_column(p, q, mixed, row, bh, block, p.dv);
      flag_unless_finite(den, non_finite);
      out = y / (den + T(p.eps));
    }
    flag_unless_finite(out, non_finite);
    o[idx] = out;
  }
}

// Per token: 1 / (den + eps) (or the scale) and the gradient of the
// denominator, -sum_e grad_o[e] o[e] / (den + eps) (0 unnormalised).
template <typename T>
__global__ void token_terms_kernel(KernelProblem p, const T* q, const T* mixed, const T* grad_o,
                                   T* terms) {
  const int64_t total = p.batch * p.tokens * p.heads;
  MHLA_GRID_STRIDE(row, total) {
    const auto [bh, block] = place_of(p, row);
    if (!p.normalize) {
      terms[2 * row] = T(p.scale);
      terms[2 * row + 1] = 0;
      continue;
    }
    const T inv = T(1) / (read_column(p, q, mixed, row, bh, block, p.dv) + T(p.eps));
    T dot = 0;
    for (int64_t e = 0; e < p.dv; ++e)
      dot += grad_o[row * p.dv + e] * read_column(p, q, mixed, row, bh, block, e);
    terms[2 * row] = inv;
    terms[2 * row + 1] = -dot * inv * inv;
  }
}

// d y_t[e] for e < Dv, and for e = Dv the denominator's gradient.
template <typename T>
__device__ T output_gradient(const KernelProblem& p, const T* grad_o, const T* terms, int64_t row,
                             int64_t e) {
  return e < p.dv ? terms[2 * row] * grad_o[row * p.dv + e] : terms[2 * row + 1];
}

template <typename T>
__global__ void query_gradient_kernel(KernelProblem p, const T* q, const T* mixed,
                                      const T* grad_o, const T* terms, T* grad_q,
                                      int* non_finite) {
  const int64_t x1 = p.dv + 1, total = p.batch * p.tokens * p.heads * p.dk;
  MHLA_GRID_STRIDE(idx, total) {
    const int64_t a = idx % p.dk, row = idx / p.dk;
    const auto [bh, block] = place_of(p, row);
    const T* m = mixed + ((bh * p.blocks + block) * p.dk + a) * x1;
    T acc = 0;
    for (int64_t e = 0; e < x1; ++e) acc += output_gradient(p, grad_o, terms, row, e) * m[e];
    const T g = feature_derivative(p.phi, q[idx]) * acc;
    flag_unless_finite(g, non_finite);
    grad_q[idx] = g;
  }
}

template <typename T>
__global__ void mixed_gradient_kernel(KernelProblem p, const T* q, const T* grad_o,
                                      const T* terms, T* grad_mixed) {
  const int64_t x1 = p.dv + 1, total = p.batch * p.heads * p.blocks * p.dk * x1;
  MHLA_GRID_STRIDE(idx, total) {
    const int64_t e = idx % x1, a = idx / x1 % p.dk, i = idx / (x1 * p.dk) % p.blocks,
                  bh = idx / (x1 * p.dk * p.blocks);
    const int64_t bb = bh / p.heads, h = bh % p.heads;
    T acc = 0;
    for (int64_t r = p.block_start[i]; r < p.block_start[i + 1]; ++r) {
      const int64_t row = token_row(p, bb, p.block_tokens[r], h);
      acc += feature(p.phi, q[row * p.dk + a]) * output_gradient(p, grad_o, terms, row, e);
    }
    grad_mixed[idx] = acc;
  }
}

template <typename T>
__global__ void summaries_gradient_kernel(KernelProblem p, const T* w, const T* grad_mixed,
                                          T* grad_s) {
  const int64_t x = p.dk * (p.dv + 1), total = p.batch * p.heads * p.mixing_blocks * x;
  MHLA_GRID_STRIDE(idx, total) {
    const int64_t c = idx % x, b = idx / x % p.mixing_blocks, bh = idx / (x * p.mixing_blocks);
    T acc = 0;
    for (int64_t i = 0; i < p.blocks; ++i) {
      const int64_t row = p.first_block + i;
      if (reads(p, row, b))
        acc += weight(p, w, bh % p.heads, row, b) * grad_mixed[(bh * p.blocks + i) * x + c];
    }
    grad_s[idx] = acc;
  }
}

// sum over the slices of one W copy of grad_mixed[bh, i] . summaries[bh, b]
template <typename T>
__device__ T weight_gradient(const KernelProblem& p, const T* s, const T* grad_mixed, int64_t copy,
                             int64_t i, int64_t b) {
  const int64_t x = p.dk * (p.dv + 1);
  T acc = 0;
  for (int64_t bh = 0; bh < p.batch * p.heads; ++bh) {
    if (p.per_head_mixing && bh % p.heads != copy) continue;
    const T* g = grad_mixed + (bh * p.blocks + i) * x;
    const T* src = s + (bh * p.mixing_blocks + b) * x;
    for (int64_t c = 0; c < x; ++c) acc += g[c] * src[c];
  }
  return acc;
}

template <typename T>
__global__ void dense_weight_gradient_kernel(KernelProblem p, const T* s, const T* grad_mixed,
                                             T* grad_w, int* non_finite) {
  const int64_t copies = p.per_head_mixing ? p.heads : 1, total = copies * p.blocks * p.mixing_blocks;
  MHLA_GRID_STRIDE(idx, total) {
    const int64_t b = idx % p.mixing_blocks, i = idx / p.mixing_blocks % p.blocks,
                  copy = idx / (p.mixing_blocks * p.blocks);
    const int64_t row = p.first_block + i;
    if (!reads(p, row, b)) continue;
    T& entry = grad_w[(copy * p.w_stride + row) * p.w_stride + b];
    entry += weight_gradient(p, s, grad_mixed, copy, i, b);
    flag_unless_finite(entry, non_finite);
  }
}

template <typename T>
__global__ void toeplitz_weight_gradient_kernel(KernelProblem p, const T* s, const T* grad_mixed,
                                                T* grad_w, int* non_finite) {
  const int64_t copies = p.per_head_mixing ? p.heads : 1, total = copies * (p.toeplitz_length + 1);
  MHLA_GRID_STRIDE(idx, total) {
    const int64_t d = idx % (p.toeplitz_length + 1), copy = idx / (p.toeplitz_length + 1);
    T acc = 0;
    for (int64_t i = 0; i < p.blocks; ++i)
      for (int64_t b = 0; b < p.mixing_blocks; ++b) {
        const int64_t row = p.first_block + i, distance = row - b;
        if (distance < 0) continue;
        if ((distance < p.toeplitz_length ? distance : p.toeplitz_length) == d)
          acc += weight_gradient(p, s, grad_mixed, copy, i, b);
      }
    T& entry = grad_w[copy * (p.toeplitz_length + 1) + d];
    entry += acc;
    flag_unless_finite(entry, non_finite);
  }
}

template <typename T>
__global__ void key_gradient_kernel(KernelProblem p, const T* k, const T* v, const T* grad_s,
                                    T* grad_k, int* non_finite) {
  const int64_t x1 = p.dv + 1, total = p.batch * p.tokens * p.heads * p.dk;
  MHLA_GRID_STRIDE(idx, total) {
    const int64_t a = idx % p.dk, row = idx / p.dk;
    const auto [bh, block] = place_of(p, row);
    const T* ds = grad_s + ((bh * p.blocks + block) * p.dk + a) * x1;
    T acc = ds[p.dv];  // the column of ones
    for (int64_t e = 0; e < p.dv; ++e) acc += ds[e] * v[row * p.dv + e];
    const T g = feature_derivative(p.phi, k[idx]) * acc;
    flag_unless_finite(g, non_finite);
    grad_k[idx] = g;
  }
}

template <typename T>
__global__ void value_gradient_kernel(KernelProblem p, const T* k, const T* grad_s, T* grad_v,
                                      int* non_finite) {
  const int64_t x1 = p.dv + 1, total = p.batch * p.tokens * p.heads * p.dv;
  MHLA_GRID_STRIDE(idx, total) {
    const int64_t e = idx % p.dv, row = idx / p.dv;
    const auto [bh, block] = place_of(p, row);
    const T* ds = grad_s + (bh * p.blocks + block) * p.dk * x1;
    T acc = 0;
    for (int64_t a = 0; a < p.dk; ++a) acc += feature(p.phi, k[row * p.dk + a]) * ds[a * x1 + e];
    flag_unless_finite(acc, non_finite);
    grad_v[idx] = acc;
  }
}

}  // namespace

template <typename T>
void summaries(const KernelProblem& p, const T* k, const T* v, T* s, cudaStream_t stream) {
  const int64_t total = p.batch * p.heads * p.blocks * p.dk * (p.dv + 1);
  summaries_kernel<<<grid_for(total), kThreads, 0, stream>>>(p, k, v, s);
  check_launch("summaries_kernel");
}

template <typename T>
void mix(const KernelProblem& p, const T* w, const T* s, T* mixed, cudaStream_t stream) {
  const int64_t total = p.batch * p.heads * p.blocks * p.dk * (p.dv + 1);
  mix_kernel<<<grid_for(total), kThreads, 0, stream>>>(p, w, s, mixed);
  check_launch("mix_kernel");
}

template <typename T>
void outputs(const KernelProblem& p, const T* q, const T* mixed, T* o, int* non_finite,
             cudaStream_t stream) {
  const int64_t total = p.batch * p.tokens * p.heads * p.dv;
  outputs_kernel<<<grid_for(total), kThreads, 0, stream>>>(p, q, mixed, o, non_finite);
  check_launch("outputs_kernel");
}

template <typename T>
void output_gradients(const KernelProblem& p, const T* q, const T* mixed, const T* grad_o,
                      T* grad_q, T* grad_mixed, T* token_terms, int* non_finite,
                      cudaStream_t stream) {
  const int64_t tokens = p.batch * p.tokens * p.heads;
  token_terms_kernel<<<grid_for(tokens), kThreads, 0, stream>>>(p, q, mixed, grad_o, token_terms);
  check_launch("token_terms_kernel");
  query_gradient_kernel<<<grid_for(tokens * p.dk), kThreads, 0, stream>>>(
      p, q, mixed, grad_o, token_terms, grad_q, non_finite);
  check_launch("query_gradient_kernel");
  const int64_t mixed_total = p.batch * p.heads * p.blocks * p.dk * (p.dv + 1);
  mixed_gradient_kernel<<<grid_for(mixed_total), kThreads, 0, stream>>>(p, q, grad_o, token_terms,
                                                                        grad_mixed);
  check_launch("mixed_gradient_kernel");
}

template <typename T>
void mix_backward(const KernelProblem& p, const T* w, const T* s, const T* grad_mixed, T* grad_s,
                  T* grad_w, int* non_finite, cudaStream_t stream) {
  const int64_t total = p.batch * p.heads * p.mixing_blocks * p.dk * (p.dv + 1);
  summaries_gradient_kernel<<<grid_for(total), kThreads, 0, stream>>>(p, w, grad_mixed, grad_s);
  check_launch("summaries_gradient_kernel");
  if (grad_w == nullptr) return;  // linear attention: no W to learn
  const int64_t copies = p.per_head_mixing ? p.heads : 1;
  if (p.toeplitz) {
    toeplitz_weight_gradient_kernel<<<grid_for(copies * (p.toeplitz_length + 1)), kThreads, 0,
                                      stream>>>(p, s, grad_mixed, grad_w, non_finite);
    check_launch("toeplitz_weight_gradient_kernel");
  } else {
    dense_weight_gradient_kernel<<<grid_for(copies * p.blocks * p.mixing_blocks), kThreads, 0,
                                   stream>>>(p, s, grad_mixed, grad_w, non_finite);
    check_launch("dense_weight_gradient_kernel");
  }
}

template <typename T>
void key_value_gradients(const KernelProblem& p, const T* k, const T* v, const T* grad_s,
                         T* grad_k, T* grad_v, int* non_finite, cudaStream_t stream) {
  const int64_t tokens = p.batch * p.tokens * p.heads;
  key_gradient_kernel<<<grid_for(tokens * p.dk), kThreads, 0, stream>>>(p, k, v, grad_s, grad_k,
                                                                        non_finite);
  check_launch("key_gradient_kernel");
  value_gradient_kernel<<<grid_for(tokens * p.dv), kThreads, 0, stream>>>(p, k, grad_s, grad_v,
                                                                          non_finite);
  check_launch("value_gradient_kernel");
}

#define MHLA_INSTANTIATE_THREAD_PER_RESULT_KERNELS(T)                                              \
  template void summaries<T>(const KernelProblem&, const T*, const T*, T*, cudaStream_t);          \
  template void mix<T>(const KernelProblem&, const T*, const T*, T*, cudaStream_t);                \
  template void outputs<T>(const KernelProblem&, const T*, const T*, T*, int*, cudaStream_t);      \
  template void output_gradients<T>(const KernelProblem&, const T*, const T*, const T*, T*, T*,    \
                                    T*, int*, cudaStream_t);                                       \
  template void mix_backward<T>(const KernelProblem&, const T*, const T*, const T*, T*, T*, int*,  \
                                cudaStream_t);                                                     \
  template void key_value_gradients<T>(const KernelProblem&, const T*, const T*, const T*, T*,     \
                                       T*, int*, cudaStream_t);
MHLA_INSTANTIATE_THREAD_PER_RESULT_KERNELS(float)
MHLA_INSTANTIATE_THREAD_PER_RESULT_KERNELS(double)
#undef MHLA_INSTANTIATE_THREAD_PER_RESULT_KERNELS

}  // namespace mhla::cuda
