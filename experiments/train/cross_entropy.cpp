#include "train/cross_entropy.hpp"

#include <algorithm>
#include <cmath>

#include "mhla/error.hpp"

namespace mhla::train {

template <typename T>
LossResult cross_entropy(const std::vector<T>& logits, const std::vector<int32_t>& targets,
                         int64_t classes, std::vector<T>* grad) {
  const int64_t rows = int64_t(targets.size());
  if (int64_t(logits.size()) != rows * classes)
    throw Error("cross_entropy: " + std::to_string(logits.size()) + " logits for " +
                std::to_string(rows) + " targets of " + std::to_string(classes) + " classes");
  LossResult result;
  for (int32_t t : targets) {
    if (t >= classes || t < -1)
      throw Error("cross_entropy: target " + std::to_string(t) + " outside [-1, " +
                  std::to_string(classes) + ")");
    result.labelled += t >= 0;
  }
  if (grad) grad->assign(logits.size(), T(0));
  if (result.labelled == 0) return result;
  double total = 0;
  for (int64_t r = 0; r < rows; ++r) {
    if (targets[size_t(r)] < 0) continue;
    const T* l = logits.data() + r * classes;
    const int64_t best = std::max_element(l, l + classes) - l;
    const double top = double(l[best]);
    double sum = 0;
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(double(l[c]) - top);
    const int64_t target = targets[size_t(r)];
    total += std::log(sum) + top - double(l[target]);
    result.correct += best == target;
    if (grad) {
      T* g = grad->data() + r * classes;
      const double scale = 1.0 / double(result.labelled);
      for (int64_t c = 0; c < classes; ++c) g[c] = T(std::exp(double(l[c]) - top) / sum * scale);
      g[target] -= T(scale);
    }
  }
  result.loss = total / double(result.labelled);
  return result;
}

template LossResult cross_entropy(const std::vector<float>&, const std::vector<int32_t>&, int64_t,
                                  std::vector<float>*);
template LossResult cross_entropy(const std::vector<double>&, const std::vector<int32_t>&, int64_t,
                                  std::vector<double>*);

}  // namespace mhla::train
