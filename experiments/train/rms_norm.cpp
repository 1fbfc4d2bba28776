#include "train/rms_norm.hpp"

#include <cmath>

namespace mhla::train {

template <typename T>
RMSNorm<T>::RMSNorm(const std::string& name, int64_t dim_)
    : dim(dim_), gain(name + ".gain", {dim_}, /*decay=*/false) {
  for (T& g : gain.value) g = T(1);
}

template <typename T>
void RMSNorm<T>::forward(const T* x, int64_t rows, T* y) {
  inv_rms_.resize(size_t(rows));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    double sum = 0;
    for (int64_t j = 0; j < dim; ++j) sum += double(xr[j]) * xr[j];
    const T inv = T(1.0 / std::sqrt(sum / double(dim) + eps));
    inv_rms_[size_t(r)] = inv;
    for (int64_t j = 0; j < dim; ++j) y[r * dim + j] = xr[j] * inv * gain.value[size_t(j)];
  }
}

template <typename T>
void RMSNorm<T>::backward(const T* x, const T* dy, int64_t rows, T* dx) {
  // With u = x * inv: dx = inv * (dy*g - u * mean(dy*g*u)), dg = sum_rows dy*u.
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const T inv = inv_rms_[size_t(r)];
    const T* xr = x + r * dim;
    const T* dyr = dy + r * dim;
    double dot = 0;
    for (int64_t j = 0; j < dim; ++j) dot += double(dyr[j]) * gain.value[size_t(j)] * xr[j] * inv;
    const T mean = T(dot / double(dim));
    for (int64_t j = 0; j < dim; ++j)
      dx[r * dim + j] = inv * (dyr[j] * gain.value[size_t(j)] - xr[j] * inv * mean);
  }
  // Serial over rows so the sum's order, and so the result, never depends on threads.
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < dim; ++j)
      gain.grad[size_t(j)] += dy[r * dim + j] * x[r * dim + j] * inv_rms_[size_t(r)];
}

template class RMSNorm<float>;
template class RMSNorm<double>;

}  // namespace mhla::train
