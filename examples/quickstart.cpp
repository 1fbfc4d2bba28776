// MHLA on a 14x14 grid of image tokens in 7x7 blocks: forward, backward, and a
// look at the gradient of the mixing matrix. Built and run by the tests.
#include <cstdio>
#include <vector>

#include "mhla/mhla.hpp"

int main() {
  const int64_t B = 2, H = 4, D = 32;
  mhla::Options opts;
  opts.layout = mhla::TokenLayout::grid2d(14, 14, 7, 7);  // N = 196 tokens, M = 4 blocks
  opts.feature_map = mhla::FeatureMap::elu1;
  const int64_t N = opts.layout.num_tokens(), M = opts.layout.num_blocks();

  // q, k, v as produced by x @ W_qkv: [B, N, H, D], row-major.
  std::vector<float> q(B * N * H * D), k(q.size()), v(q.size()), o(q.size());
  for (size_t i = 0; i < q.size(); ++i) {
    q[i] = float(i % 7) * 0.1f - 0.3f;
    k[i] = float(i % 5) * 0.1f - 0.2f;
    v[i] = float(i % 3) - 1.0f;
  }
  // Locality-biased mixing matrix [M, M], shared by all heads; rows sum to 1.
  std::vector<float> w = mhla::init_mixing(opts.layout);

  const std::vector<int64_t> shape = {B, N, H, D}, w_shape = {M, M};
  mhla::ForwardState<float> state;  // what forward keeps for backward
  mhla::forward<float>(opts, {q.data(), shape}, {k.data(), shape}, {v.data(), shape},
                       {w.data(), w_shape}, {o.data(), shape}, state);

  // Backward of L = sum(o): gradients for q, k, v and the mixing matrix.
  std::vector<float> grad_o(o.size(), 1.0f), dq(q.size()), dk(k.size()), dv(v.size()), dw(w.size());
  mhla::backward<float>(opts, {q.data(), shape}, {k.data(), shape}, {v.data(), shape},
                        {w.data(), w_shape}, {o.data(), shape}, {grad_o.data(), shape},
                        {dq.data(), shape}, {dk.data(), shape}, {dv.data(), shape},
                        {dw.data(), w_shape}, state);
  std::printf("o[0] = %.4f, dL/dW[0,0] = %.4f\n", o[0], dw[0]);

  // Bad input is an mhla::Error naming the argument, never a crash.
  try {
    mhla::forward<float>(opts, {q.data(), shape}, {k.data(), shape}, {v.data(), shape},
                         {w.data(), {M + 1, M + 1}}, {o.data(), shape});
  } catch (const mhla::Error& e) {
    std::printf("rejected: %s\n", e.what());
    return 0;
  }
  return 1;  // the bad call above must have thrown
}
