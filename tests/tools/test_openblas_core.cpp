// The mhla program's choice of OpenBLAS kernels: only OpenBLAS's SSE3
// fallback is replaced, by the widest kernels the CPU runs, and never a core
// the user named.
#include "common/openblas_core.hpp"
#include "test_support.hpp"

namespace mhla::test {
namespace {

using tools::openblas_core_to_restart_with;
using tools::VectorUnits;

constexpr VectorUnits kAvx512{true, true}, kAvx2{true, false}, kSse{false, false};

TEST(OpenblasCore, TheSse3FallbackIsReplacedByTheWidestKernelsTheCpuRuns) {
  EXPECT_EQ(openblas_core_to_restart_with("Prescott", nullptr, kAvx512), "SkylakeX");
  EXPECT_EQ(openblas_core_to_restart_with("prescott", nullptr, kAvx2), "Haswell");
  EXPECT_EQ(openblas_core_to_restart_with("Prescott", nullptr, kSse), "");
}

TEST(OpenblasCore, AKnownCpuAndTheUsersChoiceAreKept) {
  for (const char* known : {"SkylakeX", "Haswell", "Zen", "Cooperlake", "Prescott2", ""})
    EXPECT_EQ(openblas_core_to_restart_with(known, nullptr, kAvx512), "") << known;
  EXPECT_EQ(openblas_core_to_restart_with("Prescott", "Prescott", kAvx512), "");
  EXPECT_EQ(openblas_core_to_restart_with("Prescott", "", kAvx512), "");
}

}  // namespace
}  // namespace mhla::test
