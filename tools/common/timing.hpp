#pragma once
// Wall-clock timing for benchmarks: one warm-up call, then repeats until both a
// minimum count and a minimum total time are reached; the median is reported
// because these machines are shared and noisy (outliers are slow, never fast).
#include <algorithm>
#include <chrono>
#include <vector>

namespace mhla::tools {

struct TimingPolicy {
  int min_repeats = 3;
  double min_seconds = 0.3;
  int max_repeats = 50;
  bool warm_up = true;
};

template <typename Fn>
double median_seconds(Fn&& fn, const TimingPolicy& policy = {}) {
  using clock = std::chrono::steady_clock;
  if (policy.warm_up) fn();
  std::vector<double> samples;
  double total = 0;
  while (int(samples.size()) < policy.max_repeats &&
         (int(samples.size()) < policy.min_repeats || total < policy.min_seconds)) {
    const auto start = clock::now();
    fn();
    const double s = std::chrono::duration<double>(clock::now() - start).count();
    samples.push_back(s);
    total += s;
  }
  std::nth_element(samples.begin(), samples.begin() + samples.size() / 2, samples.end());
  return samples[samples.size() / 2];
}

}  // namespace mhla::tools
