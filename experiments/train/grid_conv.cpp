#include "train/grid_conv.hpp"

#include <cmath>

#include "mhla/error.hpp"

namespace mhla::train {

template <typename T>
GridConv<T>::GridConv(const std::string& name, int64_t channels_, int64_t kernel_, Rng& rng)
    : channels(channels_),
      kernel(kernel_),
      weight(name + ".weight", {channels_, kernel_, kernel_}, /*decay=*/false) {
  if (kernel_ <= 0 || kernel_ % 2 == 0)
    throw Error(name + ": the 2D positional convolution needs an odd kernel, got " +
                std::to_string(kernel_));
  fill_uniform(weight, 1.0 / double(kernel), rng);
}

template <typename T>
void GridConv<T>::forward(const T* x, int64_t batch, int64_t rows, int64_t cols, T* y) const {
  const int64_t half = kernel / 2;
  const T* w = weight.value.data();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        T* yr = y + ((b * rows + r) * cols + c) * channels;
        for (int64_t ch = 0; ch < channels; ++ch) yr[ch] = T(0);
        for (int64_t i = 0; i < kernel; ++i) {
          const int64_t rr = r + i - half;
          if (rr < 0 || rr >= rows) continue;
          for (int64_t j = 0; j < kernel; ++j) {
            const int64_t cc = c + j - half;
            if (cc < 0 || cc >= cols) continue;
            const T* xr = x + ((b * rows + rr) * cols + cc) * channels;
            for (int64_t ch = 0; ch < channels; ++ch)
              yr[ch] += w[(ch * kernel + i) * kernel + j] * xr[ch];
          }
        }
      }
}

template <typename T>
void GridConv<T>::backward(const T* x, const T* dy, int64_t batch, int64_t rows, int64_t cols,
                           T* dx) {
  const int64_t half = kernel / 2;
  const T* w = weight.value.data();
  // dx[s] gathers the outputs that read s: output r = s - (i - half).
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        T* dxr = dx + ((b * rows + r) * cols + c) * channels;
        for (int64_t ch = 0; ch < channels; ++ch) dxr[ch] = T(0);
        for (int64_t i = 0; i < kernel; ++i) {
          const int64_t rr = r - i + half;
          if (rr < 0 || rr >= rows) continue;
          for (int64_t j = 0; j < kernel; ++j) {
            const int64_t cc = c - j + half;
            if (cc < 0 || cc >= cols) continue;
            const T* dyr = dy + ((b * rows + rr) * cols + cc) * channels;
            for (int64_t ch = 0; ch < channels; ++ch)
              dxr[ch] += w[(ch * kernel + i) * kernel + j] * dyr[ch];
          }
        }
      }
  // Serial, so the weight gradient does not depend on the thread count.
  T* dw = weight.grad.data();
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const T* dyr = dy + ((b * rows + r) * cols + c) * channels;
        for (int64_t i = 0; i < kernel; ++i) {
          const int64_t rr = r + i - half;
          if (rr < 0 || rr >= rows) continue;
          for (int64_t j = 0; j < kernel; ++j) {
            const int64_t cc = c + j - half;
            if (cc < 0 || cc >= cols) continue;
            const T* xr = x + ((b * rows + rr) * cols + cc) * channels;
            for (int64_t ch = 0; ch < channels; ++ch)
              dw[(ch * kernel + i) * kernel + j] += dyr[ch] * xr[ch];
          }
        }
      }
}

template class GridConv<float>;
template class GridConv<double>;

}  // namespace mhla::train
