#pragma once
// What a run has measured so far; checkpoints carry it so a resumed run's
// curves and totals continue where they stopped.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

namespace mhla::train {

struct EvalPoint {
  int64_t step = 0;  // steps completed when evaluated
  double loss = 0, accuracy = 0;
};

struct History {
  std::vector<double> train_loss;      // one per completed step
  std::vector<double> train_accuracy;  // of the step's own batch, on labelled positions
  std::vector<EvalPoint> eval;
  double seconds = 0;  // training time, summed over resumes
};

// The index of the best evaluation (lowest loss when by_loss, else highest
// accuracy with the lower loss breaking ties; the earliest of equals), or -1
// when there is none.
int64_t best_evaluation(const std::vector<EvalPoint>& eval, bool by_loss);

nlohmann::json to_json(const History& history);
History history_from_json(const nlohmann::json& j);  // mhla::Error when malformed

}  // namespace mhla::train
