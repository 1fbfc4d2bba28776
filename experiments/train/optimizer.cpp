#include "train/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace mhla::train {

template <typename T>
AdamW<T>::AdamW(const ParameterList<T>& parameters, const AdamWConfig& config)
    : parameters_(parameters), config_(config) {
  for (const Parameter<T>* p : parameters_) {
    m_.emplace_back(p->value.size(), T(0));
    v_.emplace_back(p->value.size(), T(0));
  }
}

template <typename T>
void AdamW<T>::step(double lr) {
  ++step_;
  const double c1 = 1 - std::pow(config_.beta1, double(step_));
  const double c2 = 1 - std::pow(config_.beta2, double(step_));
  for (size_t i = 0; i < parameters_.size(); ++i) {
    Parameter<T>& p = *parameters_[i];
    const double rate = lr * p.lr_scale;
    const double decay = p.decay ? 1 - rate * config_.weight_decay : 1;
    for (size_t j = 0; j < p.value.size(); ++j) {
      const double g = double(p.grad[j]);
      const double m = config_.beta1 * double(m_[i][j]) + (1 - config_.beta1) * g;
      const double v = config_.beta2 * double(v_[i][j]) + (1 - config_.beta2) * g * g;
      m_[i][j] = T(m);
      v_[i][j] = T(v);
      const double updated =
          double(p.value[j]) * decay - rate * (m / c1) / (std::sqrt(v / c2) + config_.eps);
      p.value[j] = T(std::clamp(updated, p.lower, p.upper));
    }
  }
}

double scheduled_lr(int64_t step, int64_t total, int64_t warmup, double peak, double min_ratio) {
  if (step < warmup) return peak * double(step + 1) / double(warmup);
  const int64_t span = std::max<int64_t>(total - warmup - 1, 1);
  const double progress = std::min(1.0, double(step - warmup) / double(span));
  return peak * (min_ratio + (1 - min_ratio) * 0.5 * (1 + std::cos(std::numbers::pi * progress)));
}

template <typename T>
double clip_grad_norm(const ParameterList<T>& parameters, double max_norm) {
  double sum = 0;
  for (const Parameter<T>* p : parameters)
    for (T g : p->grad) sum += double(g) * double(g);
  const double norm = std::sqrt(sum);
  if (max_norm > 0 && norm > max_norm) {
    const T scale = T(max_norm / (norm + 1e-12));
    for (Parameter<T>* p : parameters)
      for (T& g : p->grad) g *= scale;
  }
  return norm;
}

template class AdamW<float>;
template class AdamW<double>;
template double clip_grad_norm(const ParameterList<float>&, double);
template double clip_grad_norm(const ParameterList<double>&, double);

}  // namespace mhla::train
