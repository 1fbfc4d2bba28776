#pragma once
// Diagnostics of an attention matrix, for the paper's "global context collapse":
// linear attention's matrix has rank <= Dk and near-uniform rows; MHLA's
// regains rank and selectivity.
#include <cstdint>
#include <vector>

namespace mhla {

// Singular values of a row-major rows x cols matrix, descending (LAPACK dgesdd).
std::vector<double> singular_values(const std::vector<double>& matrix, int64_t rows, int64_t cols);

// Number of singular values above tol = max(rows, cols) * eps_double * sigma_max
// (the tolerance NumPy's matrix_rank uses).
int64_t numerical_rank(const std::vector<double>& matrix, int64_t rows, int64_t cols);

// Mean over rows of -sum_s p_s ln p_s, where p is the row divided by its sum
// (rows must be non-negative). In nats; a uniform row over n entries gives ln n.
double mean_row_entropy(const std::vector<double>& matrix, int64_t rows, int64_t cols);

}  // namespace mhla
