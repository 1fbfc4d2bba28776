#pragma once
// y = x W^T + b over a batch of rows, through the operator's BLAS.
#include "train/parameter.hpp"

namespace mhla::train {

template <typename T>
class Linear {
 public:
  Linear() = default;
  // W [out, in] ~ U(-1/sqrt(in), 1/sqrt(in)) (PyTorch's default), b = 0.
  Linear(const std::string& name, int64_t in, int64_t out, bool bias, Rng& rng);

  // x [rows, in] -> y [rows, out] (overwritten).
  void forward(const T* x, int64_t rows, T* y) const;
  // Adds dL/dW, dL/db to the gradients; writes dL/dx [rows, in] when dx is not null.
  void backward(const T* x, const T* dy, int64_t rows, T* dx);

  void collect(ParameterList<T>& out) {
    out.push_back(&weight);
    if (has_bias) out.push_back(&bias);
  }
  int64_t in = 0, out = 0;
  bool has_bias = false;
  Parameter<T> weight, bias;
};

}  // namespace mhla::train
