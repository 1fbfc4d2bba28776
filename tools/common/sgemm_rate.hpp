#pragma once
// The machine's own SGEMM rate through the BLAS the operator uses: the yardstick
// every MHLA rate is divided by.
#include <vector>

namespace mhla::tools {

// A square n x n x n SGEMM with all threads, to time alongside other work.
class SgemmProbe {
 public:
  explicit SgemmProbe(int n = 2048);
  void run();
  double flops() const { return 2.0 * n_ * double(n_) * n_; }

 private:
  int n_;
  std::vector<float> a_, b_, c_;
};

}  // namespace mhla::tools
