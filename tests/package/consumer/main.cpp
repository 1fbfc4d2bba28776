// Uses the installed headers and library: the fast float operator against the
// fp64 reference on a small causal problem, a decoder step, and the version.
// Exits non-zero on any disagreement. Argument: the version it must report.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "mhla/mhla.hpp"
#include "mhla/version.hpp"

int main(int argc, char** argv) {
  if (argc != 2 || std::strcmp(argv[1], mhla::version) != 0) {
    std::fprintf(stderr, "version %s, expected %s\n", mhla::version, argc == 2 ? argv[1] : "?");
    return 1;
  }
  const int64_t B = 1, N = 37, H = 2, D = 8, block = 8;
  mhla::Options options;
  options.layout = mhla::TokenLayout::sequence(N, block);
  options.masking = mhla::Masking::causal;
  options.feature_map = mhla::FeatureMap::elu1;
  const int64_t M = options.layout.num_blocks();
  std::vector<float> q(B * N * H * D), k(q.size()), v(q.size()), o(q.size());
  for (size_t i = 0; i < q.size(); ++i) {
    q[i] = std::sin(0.37f * float(i));
    k[i] = std::cos(0.11f * float(i));
    v[i] = std::sin(0.05f * float(i) + 1.0f);
  }
  mhla::MixingInit init;
  init.causal = true;
  const std::vector<float> w = mhla::init_mixing(options.layout, init);
  const std::vector<int64_t> shape = {B, N, H, D}, w_shape = {M, M};
  mhla::forward<float>(options, {q.data(), shape}, {k.data(), shape}, {v.data(), shape},
                       {w.data(), w_shape}, {o.data(), shape});

  const std::vector<double> qd(q.begin(), q.end()), kd(k.begin(), k.end()), vd(v.begin(), v.end()),
      wd(w.begin(), w.end());
  std::vector<double> expected(o.size());
  mhla::reference::dense_forward(options, {qd.data(), shape}, {kd.data(), shape},
                                 {vd.data(), shape}, {wd.data(), w_shape},
                                 {expected.data(), shape});
  double worst = 0;
  for (size_t i = 0; i < o.size(); ++i) worst = std::max(worst, std::abs(o[i] - expected[i]));

  // The decoder, fed token by token, reproduces the causal forward.
  mhla::DecoderOptions decoding;
  decoding.heads = H;
  decoding.dk = decoding.dv = D;
  decoding.block = block;
  decoding.feature_map = options.feature_map;
  mhla::Decoder decoder(decoding, {w.data(), w_shape});
  const std::vector<int64_t> token = {1, 1, H, D};
  std::vector<float> out(H * D);
  for (int64_t t = 0; t < N; ++t) {
    const int64_t at = t * H * D;
    decoder.step({q.data() + at, token}, {k.data() + at, token}, {v.data() + at, token},
                 {out.data(), token});
    for (int64_t i = 0; i < H * D; ++i)
      worst = std::max(worst, std::abs(out[i] - expected[at + i]));
  }
  std::printf("mhla %s (%s kernels): largest difference from the reference %.2e\n", mhla::version,
              mhla::kernel_isa().c_str(), worst);
  return worst < 1e-4 ? 0 : 1;
}
