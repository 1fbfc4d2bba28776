#pragma once
// The Transformer's feed-forward block: Linear -> GELU (tanh form) -> Linear.
#include "train/linear.hpp"

namespace mhla::train {

template <typename T>
class MLP {
 public:
  MLP() = default;
  MLP(const std::string& name, int64_t dim, int64_t hidden, Rng& rng);

  // x, y [rows, dim]; keeps the hidden activations for backward.
  void forward(const T* x, int64_t rows, T* y);
  // dx [rows, dim] (overwritten); x must be forward's input.
  void backward(const T* x, const T* dy, int64_t rows, T* dx);

  void collect(ParameterList<T>& out) {
    up.collect(out);
    down.collect(out);
  }
  Linear<T> up, down;

 private:
  std::vector<T> pre_, act_, grad_;  // [rows, hidden]
};

// Exposed for the gradient tests.
template <typename T>
T gelu(T x);
template <typename T>
T gelu_derivative(T x);

}  // namespace mhla::train
