#include "common/sgemm_rate.hpp"

#include <cblas.h>

namespace mhla::tools {

SgemmProbe::SgemmProbe(int n)
    : n_(n), a_(size_t(n) * n, 0.5f), b_(size_t(n) * n, 0.25f), c_(size_t(n) * n) {}

void SgemmProbe::run() {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n_, n_, n_, 1.0f, a_.data(), n_, b_.data(),
              n_, 0.0f, c_.data(), n_);
}

}  // namespace mhla::tools
