#include "train/short_conv.hpp"

#include <cmath>

namespace mhla::train {

template <typename T>
ShortConv<T>::ShortConv(const std::string& name, int64_t channels_, int64_t kernel_, Rng& rng)
    : channels(channels_),
      kernel(kernel_),
      weight(name + ".weight", {channels_, kernel_}, /*decay=*/false) {
  fill_uniform(weight, 1.0 / std::sqrt(double(kernel)), rng);
}

template <typename T>
void ShortConv<T>::forward(const T* x, int64_t batch, int64_t tokens, T* y) const {
  const T* w = weight.value.data();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < tokens; ++t) {
      T* yr = y + (b * tokens + t) * channels;
      for (int64_t c = 0; c < channels; ++c) yr[c] = T(0);
      for (int64_t j = 0; j < kernel && j <= t; ++j) {
        const T* xr = x + (b * tokens + t - j) * channels;
        for (int64_t c = 0; c < channels; ++c) yr[c] += w[c * kernel + j] * xr[c];
      }
    }
}

template <typename T>
void ShortConv<T>::backward(const T* x, const T* dy, int64_t batch, int64_t tokens, T* dx) {
  const T* w = weight.value.data();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < tokens; ++s) {
      T* dxr = dx + (b * tokens + s) * channels;
      for (int64_t c = 0; c < channels; ++c) dxr[c] = T(0);
      for (int64_t j = 0; j < kernel && s + j < tokens; ++j) {
        const T* dyr = dy + (b * tokens + s + j) * channels;
        for (int64_t c = 0; c < channels; ++c) dxr[c] += w[c * kernel + j] * dyr[c];
      }
    }
  // Serial, so the weight gradient does not depend on the thread count.
  T* dw = weight.grad.data();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t j = 0; j < kernel && j <= t; ++j) {
        const T* dyr = dy + (b * tokens + t) * channels;
        const T* xr = x + (b * tokens + t - j) * channels;
        for (int64_t c = 0; c < channels; ++c) dw[c * kernel + j] += dyr[c] * xr[c];
      }
}

template class ShortConv<float>;
template class ShortConv<double>;

}  // namespace mhla::train
