#include "train/linear.hpp"

#include <cmath>

#include "mhla_support/blas.hpp"

namespace mhla::train {

template <typename T>
Linear<T>::Linear(const std::string& name, int64_t in_, int64_t out_, bool bias_, Rng& rng)
    : in(in_),
      out(out_),
      has_bias(bias_),
      weight(name + ".weight", {out_, in_}),
      bias(name + ".bias", {out_}, /*decay=*/false) {
  fill_uniform(weight, 1.0 / std::sqrt(double(in)), rng);
}

template <typename T>
void Linear<T>::forward(const T* x, int64_t rows, T* y) const {
  if (has_bias) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < out; ++j) y[r * out + j] = bias.value[size_t(j)];
  }
  cpu::gemm(false, true, rows, out, in, T(1), x, in, weight.value.data(), in,
            has_bias ? T(1) : T(0), y, out);
}

template <typename T>
void Linear<T>::backward(const T* x, const T* dy, int64_t rows, T* dx) {
  // dW += dy^T x; db += column sums of dy; dx = dy W.
  cpu::gemm(true, false, out, in, rows, T(1), dy, out, x, in, T(1), weight.grad.data(), in);
  if (has_bias)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < out; ++j) bias.grad[size_t(j)] += dy[r * out + j];
  if (dx)
    cpu::gemm(false, false, rows, in, out, T(1), dy, out, weight.value.data(), in, T(0), dx, in);
}

template class Linear<float>;
template class Linear<double>;

}  // namespace mhla::train
