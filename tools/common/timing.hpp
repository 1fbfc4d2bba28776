#pragma once
// Wall-clock timing for benchmarks: one warm-up call, then repeats until both a
// minimum count and a minimum total time are reached; the median is reported
// because these machines are shared and noisy (outliers are slow, never fast).
#include <algorithm>
#include <chrono>
#include <functional>
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

// Runs the functions in turn, repeat after repeat (after one warm-up round),
// and returns each one's median. On a shared machine they then all see the
// same background load, so their ratios stay stable even when absolute times
// drift (seen here: the SGEMM rate alone moved between 135 and 182 GFLOP/s).
inline std::vector<double> interleaved_medians(const std::vector<std::function<void()>>& fns,
                                               int repeats) {
  using clock = std::chrono::steady_clock;
  std::vector<std::vector<double>> samples(fns.size());
  for (int r = -1; r < repeats; ++r)
    for (size_t i = 0; i < fns.size(); ++i) {
      const auto start = clock::now();
      fns[i]();
      if (r >= 0) samples[i].push_back(std::chrono::duration<double>(clock::now() - start).count());
    }
  std::vector<double> medians;
  for (auto& s : samples) {
    std::nth_element(s.begin(), s.begin() + s.size() / 2, s.end());
    medians.push_back(s[s.size() / 2]);
  }
  return medians;
}

}  // namespace mhla::tools
