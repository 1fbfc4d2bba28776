#pragma once
// Depthwise k x k convolution over a 2D token grid with zero padding (centred,
// so not causal): y[r, c, ch] = sum_{i, j} w[ch, i, j] x[r + i - k/2, c + j - k/2, ch].
// The positional term that the paper adds to the values of vision models
// (CPE / LePE: o = Attention(q, k, v) + DWConv(v)).
#include "train/parameter.hpp"

namespace mhla::train {

template <typename T>
class GridConv {
 public:
  GridConv() = default;
  // kernel must be odd.
  GridConv(const std::string& name, int64_t channels, int64_t kernel, Rng& rng);

  // x, y [batch, rows, cols, channels]; y overwritten.
  void forward(const T* x, int64_t batch, int64_t rows, int64_t cols, T* y) const;
  // dx overwritten; adds dL/dw. x must be forward's input.
  void backward(const T* x, const T* dy, int64_t batch, int64_t rows, int64_t cols, T* dx);

  void collect(ParameterList<T>& out) { out.push_back(&weight); }
  int64_t channels = 0, kernel = 0;
  Parameter<T> weight;  // [channels, kernel, kernel]
};

}  // namespace mhla::train
