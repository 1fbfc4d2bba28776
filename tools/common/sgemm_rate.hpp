#pragma once
// The machine's own SGEMM rate through the BLAS the operator uses: the yardstick
// every MHLA rate is divided by.
namespace mhla::tools {

// GFLOP/s of a square n x n x n SGEMM with all threads (median of repeats).
double sgemm_gflops(int n = 2048);

}  // namespace mhla::tools
