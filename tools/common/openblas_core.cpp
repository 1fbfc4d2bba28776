#include "common/openblas_core.hpp"

#include <cblas.h>
#include <strings.h>
#include <unistd.h>

#include <cstdlib>

namespace mhla::tools {

std::string openblas_core_to_restart_with(std::string_view chosen, const char* coretype_variable,
                                          VectorUnits cpu) {
  if (coretype_variable != nullptr) return "";
  if (chosen.size() != 8 || strncasecmp(chosen.data(), "prescott", 8) != 0) return "";
  if (cpu.avx512) return "SkylakeX";
  if (cpu.avx2_fma) return "Haswell";
  return "";
}

VectorUnits this_cpu_vector_units() {
  __builtin_cpu_init();
  return {__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"),
          __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
              __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
              __builtin_cpu_supports("avx512vl")};
}

void restart_on_known_openblas_kernels(char** argv) {
  const std::string core = openblas_core_to_restart_with(
      openblas_get_corename(), std::getenv("OPENBLAS_CORETYPE"), this_cpu_vector_units());
  if (core.empty()) return;
  // The variable set here also stops a second restart.
  if (setenv("OPENBLAS_CORETYPE", core.c_str(), 1) != 0) return;
  execv("/proc/self/exe", argv);
  unsetenv("OPENBLAS_CORETYPE");  // execv returned: it failed; run on as loaded
}

std::string openblas_description() {
  // The configuration starts "OpenBLAS 0.3.21 " and goes on with build flags.
  const std::string config = openblas_get_config();
  const size_t version_end = config.find(' ', config.find(' ') + 1);
  return config.substr(0, version_end) + ", " + openblas_get_corename() + " kernels";
}

}  // namespace mhla::tools
