// Uses the installed headers and library: the fast float operator against the
// fp64 reference on a small causal problem, its backward from a ForwardState
// against the backward that recomputes, a decoder step, and the version.
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
  mhla::ForwardState<float> state;
  mhla::forward<float>(options, {q.data(), shape}, {k.data(), shape}, {v.data(), shape},
                       {w.data(), w_shape}, {o.data(), shape}, state);
  // The backward reading the state gives the recomputing backward's gradients, bit for bit.
  const std::vector<float> grad_o(q.size(), 0.5f);
  std::vector<float> grads[2][4];
  for (int from_state = 0; from_state < 2; ++from_state) {
    auto& g = grads[from_state];
    g[0].resize(q.size()), g[1].resize(q.size()), g[2].resize(q.size()), g[3].resize(w.size());
    const mhla::TensorView<const float> qv{q.data(), shape}, kv{k.data(), shape},
        vv{v.data(), shape}, wv{w.data(), w_shape}, ov{o.data(), shape}, gov{grad_o.data(), shape};
    const mhla::TensorView<float> gq{g[0].data(), shape}, gk{g[1].data(), shape},
        gv{g[2].data(), shape}, gw{g[3].data(), w_shape};
    if (from_state)
      mhla::backward<float>(options, qv, kv, vv, wv, ov, gov, gq, gk, gv, gw, state);
    else
      mhla::backward<float>(options, qv, kv, vv, wv, ov, gov, gq, gk, gv, gw);
  }
  for (int i = 0; i < 4; ++i)
    if (grads[0][i] != grads[1][i]) {
      std::fprintf(stderr, "gradient %d from the ForwardState differs from the recomputed one\n", i);
      return 1;
    }

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
