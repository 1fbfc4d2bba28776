#pragma once
// AdamW (decoupled weight decay), a linear warm-up then cosine learning-rate
// schedule, and global gradient-norm clipping.
#include "train/parameter.hpp"

namespace mhla::train {

struct AdamWConfig {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
};

template <typename T>
class AdamW {
 public:
  AdamW(const ParameterList<T>& parameters, const AdamWConfig& config);
  // One update with learning rate `lr` (the schedule's value for this step).
  void step(double lr);

  int64_t steps_taken() const { return step_; }
  // The moments, for checkpoints: one per parameter, in the parameters' order.
  std::vector<std::vector<T>>& first_moments() { return m_; }
  std::vector<std::vector<T>>& second_moments() { return v_; }
  void set_steps_taken(int64_t step) { step_ = step; }

 private:
  ParameterList<T> parameters_;
  AdamWConfig config_;
  std::vector<std::vector<T>> m_, v_;
  int64_t step_ = 0;
};

// lr at `step` (0-based) of `total`: linear from peak/warmup to peak over the
// first `warmup` steps, then cosine down to min_ratio * peak at the last step.
double scheduled_lr(int64_t step, int64_t total, int64_t warmup, double peak, double min_ratio);

// Scales every gradient so that their joint L2 norm is at most max_norm (no-op
// when max_norm <= 0). Returns the norm before clipping.
template <typename T>
double clip_grad_norm(const ParameterList<T>& parameters, double max_norm);

}  // namespace mhla::train
