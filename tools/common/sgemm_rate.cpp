#include "common/sgemm_rate.hpp"

#include <cblas.h>

#include <vector>

#include "common/timing.hpp"

namespace mhla::tools {

double sgemm_gflops(int n) {
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n);
  const double seconds = median_seconds([&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
  });
  return 2.0 * n * double(n) * n / seconds / 1e9;
}

}  // namespace mhla::tools
