#include "cpu/simd/isa.hpp"

#include <hwy/highway.h>
#include <hwy/targets.h>

namespace mhla::cpu::simd {

std::vector<int64_t> runnable_targets() {
  // Taken before any pinning, which hides the better targets from Highway.
  static const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  return targets;
}

std::string target_name(int64_t target) { return hwy::TargetName(target); }

int64_t active_target() {
  const int64_t both = hwy::SupportedTargets() & HWY_TARGETS;
  return both & -both;  // Highway numbers better targets with lower bits
}

bool active_target_is_avx512() { return active_target() <= HWY_AVX3; }

void pin_target(int64_t target) {
  runnable_targets();
  // Disabling every better target leaves `target` the best one supported.
  hwy::DisableTargets(target == 0 ? 0 : (target - 1) & HWY_TARGETS);
}

}  // namespace mhla::cpu::simd
