#include <cmath>
#include <limits>
#include <string>

#include "mhla/analysis.hpp"
#include "mhla/error.hpp"

// LAPACK's divide-and-conquer SVD, provided by OpenBLAS (Fortran ABI: column
// major, arguments by pointer, trailing hidden string length).
extern "C" void dgesdd_(const char* jobz, const int* m, const int* n, double* a, const int* lda,
                        double* s, double* u, const int* ldu, double* vt, const int* ldvt,
                        double* work, const int* lwork, int* iwork, int* info, size_t jobz_len);

namespace mhla {

std::vector<double> singular_values(const std::vector<double>& matrix, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0 || int64_t(matrix.size()) != rows * cols)
    throw Error("singular_values: matrix has " + std::to_string(matrix.size()) +
                " entries, expected rows * cols = " + std::to_string(rows) + " * " +
                std::to_string(cols));
  if (rows > std::numeric_limits<int>::max() / std::max<int64_t>(cols, 1))
    throw Error("singular_values: matrix too large for LAPACK's 32-bit sizes");
  // Row-major A is column-major A^T, which has the same singular values.
  std::vector<double> a = matrix;
  const int m = int(cols), n = int(rows), lda = m, one = 1;
  std::vector<double> s(size_t(std::min(m, n)));
  std::vector<int> iwork(8 * size_t(std::min(m, n)));
  int info = 0, lwork = -1;
  double query = 0;
  dgesdd_("N", &m, &n, a.data(), &lda, s.data(), nullptr, &one, nullptr, &one, &query, &lwork,
          iwork.data(), &info, 1);
  lwork = int(query);
  std::vector<double> work(size_t(std::max(lwork, 1)));
  dgesdd_("N", &m, &n, a.data(), &lda, s.data(), nullptr, &one, nullptr, &one, work.data(), &lwork,
          iwork.data(), &info, 1);
  if (info != 0)
    throw Error("singular_values: LAPACK dgesdd failed (info = " + std::to_string(info) + ")");
  return s;
}

int64_t numerical_rank(const std::vector<double>& matrix, int64_t rows, int64_t cols) {
  const std::vector<double> s = singular_values(matrix, rows, cols);
  const double tol = double(std::max(rows, cols)) * std::numeric_limits<double>::epsilon() * s[0];
  int64_t rank = 0;
  for (double sigma : s) rank += sigma > tol;
  return rank;
}

double mean_row_entropy(const std::vector<double>& matrix, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0 || int64_t(matrix.size()) != rows * cols)
    throw Error("mean_row_entropy: matrix has " + std::to_string(matrix.size()) +
                " entries, expected " + std::to_string(rows) + " * " + std::to_string(cols));
  double total = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double x = matrix[r * cols + c];
      if (x < 0)
        throw Error("mean_row_entropy: entry (" + std::to_string(r) + ", " + std::to_string(c) +
                    ") = " + std::to_string(x) + " is negative; entropy needs non-negative rows");
      sum += x;
    }
    if (sum <= 0) continue;  // an all-zero row carries no distribution
    double h = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double p = matrix[r * cols + c] / sum;
      if (p > 0) h -= p * std::log(p);
    }
    total += h;
  }
  return total / double(rows);
}

}  // namespace mhla
