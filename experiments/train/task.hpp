#pragma once
// A training task: the model it needs, its training batches (batch `step` is a
// pure function of the run's seed and step, so a resumed run sees the same data)
// and two fixed evaluation sets: validation (for curves and for choosing
// settings such as the learning rate) and test (reported, never used to choose).
#include <memory>

#include "train/batch.hpp"
#include "train/run_config.hpp"

namespace mhla::train {

class Task {
 public:
  virtual ~Task() = default;
  virtual ModelConfig model_config() const = 0;
  virtual Batch train_batch(int64_t step) = 0;
  virtual const std::vector<Batch>& validation_batches() const = 0;
  virtual const std::vector<Batch>& test_batches() const = 0;
  // Tokens the model processes per sample (for throughput).
  virtual int64_t tokens_per_sample() const = 0;
};

// data_dir: Fashion-MNIST's folder, or the text task's corpus file (empty: the
// Debian packages').
std::unique_ptr<Task> make_task(const RunConfig& config, const std::string& data_dir);

}  // namespace mhla::train
