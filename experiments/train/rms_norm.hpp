#pragma once
// RMSNorm: y = x / sqrt(mean(x^2) + eps) * g, per row.
#include "train/parameter.hpp"

namespace mhla::train {

template <typename T>
class RMSNorm {
 public:
  RMSNorm() = default;
  RMSNorm(const std::string& name, int64_t dim);

  // x, y [rows, dim]. Keeps 1/rms per row for backward.
  void forward(const T* x, int64_t rows, T* y);
  // dx [rows, dim] (overwritten); adds dL/dg. x must be forward's input.
  void backward(const T* x, const T* dy, int64_t rows, T* dx);

  void collect(ParameterList<T>& out) { out.push_back(&gain); }
  int64_t dim = 0;
  double eps = 1e-6;
  Parameter<T> gain;

 private:
  std::vector<T> inv_rms_;
};

}  // namespace mhla::train
