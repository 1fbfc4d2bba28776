#pragma once
// `mhla demo`: the project's main job on built-in synthetic data.
#include <cstdint>

namespace mhla::tools {

struct DemoOptions {
  bool quick = false;  // smaller sizes, for smoke tests
  int64_t max_tokens = 16384;
};

// Returns the process exit code: 0 when the self-check passed.
int run_demo(const DemoOptions& options);

}  // namespace mhla::tools
