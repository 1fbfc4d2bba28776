#pragma once
// The small row-major matrix products of the float kernels (one block's
// [C, D] x [D, D] work and the like), written once with Google Highway and
// compiled for every x86 instruction set from SSE4 to AVX-512 (and the
// portable baseline); the best one the CPU supports is chosen at run time
// (see cpu/simd/isa.hpp). They do not depend on how the BLAS was built or told
// to run, and each output element is summed in the same order on every call
// and thread count.
#include <cstdint>

namespace mhla::cpu::simd {

// A matrix read in place with arbitrary strides: element (i, p) at
// data[i * row + p * col]. {a, lda, 1} is row-major A; {a, 1, lda} is A^T of
// a row-major [k, m] array.
struct Strided {
  const float* data;
  int64_t row, col;
};

// Cache lines to request while a product runs: the next block's rows, which
// then arrive while the cores compute. The product spreads the requests over
// the steps of its inner dimension; issued in one burst before it they made
// no difference (requests beyond the free miss buffers are dropped), spread
// out they made mhla_bench's forward faster. The lines come as
// runs of equally spaced rows, so that listing them costs nothing per line.
struct LineRuns {
  struct Run {
    const char* first;  // the first row's first line (64-byte aligned)
    int64_t stride;     // bytes from one row to the next
    int64_t rows;
    int64_t lines;  // lines per row
    bool write;     // to be written (else read)
  };
  const Run* runs = nullptr;
  int64_t count = 0;
};

// C[m, n] = alpha * A[m, k] B[k, n], plus C's old values when `accumulate`;
// B and C are row-major with leading dimensions ldb and ldc. Without
// `accumulate` C is only written, so it may hold anything beforehand.
void gemm(int64_t m, int64_t n, int64_t k, float alpha, Strided a, const float* b, int64_t ldb,
          bool accumulate, float* c, int64_t ldc, LineRuns prefetch = {});

// dst[p * n + j] = b[j * ldb + p] for j < n, p < k: B^T of a row-major [n, k]
// B, for the products, which read their B operand by rows.
void transpose(const float* b, int64_t ldb, int64_t n, int64_t k, float* dst);

}  // namespace mhla::cpu::simd
