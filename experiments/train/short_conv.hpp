#pragma once
// Causal depthwise convolution along the sequence, y[t, c] = sum_j w[c, j] x[t - j, c].
// It lets a token see its predecessors before attention, which is how linear
// recurrent models (H3, Based, the Zoology baselines) bind a key to the value
// that follows it; without it only softmax attention can form that binding.
#include "train/parameter.hpp"

namespace mhla::train {

template <typename T>
class ShortConv {
 public:
  ShortConv() = default;
  ShortConv(const std::string& name, int64_t channels, int64_t kernel, Rng& rng);

  // x, y [batch, tokens, channels].
  void forward(const T* x, int64_t batch, int64_t tokens, T* y) const;
  // dx overwritten; adds dL/dw. x must be forward's input.
  void backward(const T* x, const T* dy, int64_t batch, int64_t tokens, T* dx);

  void collect(ParameterList<T>& out) { out.push_back(&weight); }
  int64_t channels = 0, kernel = 0;
  Parameter<T> weight;  // [channels, kernel]; w[c, 0] acts on the token itself
};

}  // namespace mhla::train
