#pragma once
// A trainable tensor: value, gradient and a name that checkpoints use as key.
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace mhla::train {

template <typename T>
struct Parameter {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<T> value, grad;
  // AdamW decays matrices only; gains, biases and mixing logits are left alone.
  bool decay = true;
  // This parameter's learning rate is the schedule's times lr_scale (MHLA's
  // mixing learns too slowly at the shared rate), and each update is clamped
  // into [lower, upper] (the authors' raw mixing matrix lives in [1e-5, 1]).
  double lr_scale = 1;
  double lower = -std::numeric_limits<double>::infinity(),
         upper = std::numeric_limits<double>::infinity();

  Parameter() = default;
  Parameter(std::string name_, std::vector<int64_t> shape_, bool decay_ = true)
      : name(std::move(name_)), shape(std::move(shape_)), decay(decay_) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    value.assign(size_t(n), T(0));
    grad.assign(size_t(n), T(0));
  }
  int64_t size() const { return int64_t(value.size()); }
};

template <typename T>
using ParameterList = std::vector<Parameter<T>*>;

// One generator per run, so a seed fixes every initial weight.
using Rng = std::mt19937_64;

template <typename T>
void fill_normal(Parameter<T>& p, double stddev, Rng& rng) {
  std::normal_distribution<double> normal(0.0, stddev);
  for (T& x : p.value) x = T(normal(rng));
}

template <typename T>
void fill_uniform(Parameter<T>& p, double bound, Rng& rng) {
  std::uniform_real_distribution<double> uniform(-bound, bound);
  for (T& x : p.value) x = T(uniform(rng));
}

}  // namespace mhla::train
