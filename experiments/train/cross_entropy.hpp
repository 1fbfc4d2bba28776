#pragma once
// Softmax cross-entropy averaged over the labelled rows; a target of -1 marks a
// row that carries no label (in MQAR, every position but the queries).
#include <cstdint>
#include <vector>

namespace mhla::train {

struct LossResult {
  double loss = 0;       // mean over labelled rows
  int64_t labelled = 0;  // rows with a target
  int64_t correct = 0;   // labelled rows whose argmax is the target
};

// logits [rows, classes]; grad (resized to the same shape) receives dLoss/dlogits.
template <typename T>
LossResult cross_entropy(const std::vector<T>& logits, const std::vector<int32_t>& targets,
                         int64_t classes, std::vector<T>* grad);

}  // namespace mhla::train
