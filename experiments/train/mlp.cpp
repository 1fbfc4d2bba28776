#include "train/mlp.hpp"

#include <cmath>

#include "mhla_support/vector_math.hpp"

namespace mhla::train {
namespace {
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kCubic = 0.044715;

// tanh through one exp, which libmvec vectorises: libm's scalar tanhf was a
// third of a 784-token ViT step. exp(2u) = inf at large u still gives 1.
template <typename T>
T fast_tanh(T u) {
  return T(1) - T(2) / (T(1) + detail::vector_exp(T(2) * u));
}
}  // namespace

template <typename T>
T gelu(T x) {
  const T inner = T(kSqrt2OverPi) * (x + T(kCubic) * x * x * x);
  return T(0.5) * x * (T(1) + fast_tanh(inner));
}

template <typename T>
T gelu_derivative(T x) {
  const T inner = T(kSqrt2OverPi) * (x + T(kCubic) * x * x * x);
  const T t = fast_tanh(inner);
  const T dinner = T(kSqrt2OverPi) * (T(1) + T(3 * kCubic) * x * x);
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * dinner;
}

template <typename T>
MLP<T>::MLP(const std::string& name, int64_t dim, int64_t hidden, Rng& rng)
    : up(name + ".up", dim, hidden, true, rng), down(name + ".down", hidden, dim, true, rng) {}

template <typename T>
void MLP<T>::forward(const T* x, int64_t rows, T* y) {
  const size_t n = size_t(rows * up.out);
  pre_.resize(n);
  act_.resize(n);
  up.forward(x, rows, pre_.data());
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < int64_t(n); ++i) act_[size_t(i)] = gelu(pre_[size_t(i)]);
  down.forward(act_.data(), rows, y);
}

template <typename T>
void MLP<T>::backward(const T* x, const T* dy, int64_t rows, T* dx) {
  const size_t n = size_t(rows * up.out);
  grad_.resize(n);
  down.backward(act_.data(), dy, rows, grad_.data());
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < int64_t(n); ++i) grad_[size_t(i)] *= gelu_derivative(pre_[size_t(i)]);
  up.backward(x, grad_.data(), rows, dx);
}

template float gelu(float);
template double gelu(double);
template float gelu_derivative(float);
template double gelu_derivative(double);
template class MLP<float>;
template class MLP<double>;

}  // namespace mhla::train
