#pragma once
// The instruction sets the SIMD kernels were compiled for, and which of them
// runs. By default the best one the CPU supports; tests and benchmarks may
// pin a lesser one to compare the paths (results agree within rounding, and
// each path is bit-exact across runs and thread counts).
#include <cstdint>
#include <string>
#include <vector>

namespace mhla::cpu::simd {

// Highway target bits compiled into this build and supported by this CPU,
// best first.
std::vector<int64_t> runnable_targets();
std::string target_name(int64_t target);
// The target the kernels use now.
int64_t active_target();
// Whether that target is AVX-512 (AVX3) or better.
bool active_target_is_avx512();
// Runs the kernels on `target` (one of runnable_targets()) from now on, in
// every thread; 0 restores the default choice.
void pin_target(int64_t target);

}  // namespace mhla::cpu::simd
