// Every trainer layer's backward pass against central finite differences, in
// double, on small odd sizes: the loss is sum(y * probe) for a random probe.
#include <gtest/gtest.h>

#include "gradient_check.hpp"
#include "mhla/error.hpp"
#include "train/attention_layer.hpp"
#include "train/cross_entropy.hpp"
#include "train/embedding.hpp"
#include "train/grid_conv.hpp"
#include "train/mlp.hpp"
#include "train/model.hpp"
#include "train/rms_norm.hpp"
#include "train/rotary.hpp"
#include "train/short_conv.hpp"

namespace mhla::train::test {
namespace {

TEST(TrainLayers, LinearGradients) {
  Rng rng(1);
  for (bool bias : {true, false}) {
    Linear<double> layer("l", 5, 3, bias, rng);
    const int64_t rows = 7;
    std::vector<double> x = random_vector(rows * 5, 2), probe = random_vector(rows * 3, 3),
                        y(rows * 3), dx(rows * 5);
    auto loss = [&] {
      layer.forward(x.data(), rows, y.data());
      return dot(y, probe);
    };
    loss();
    layer.backward(x.data(), probe.data(), rows, dx.data());
    const std::vector<double> dw = layer.weight.grad, db = layer.bias.grad;
    expect_gradient(x, dx, loss, "linear dx");
    expect_gradient(layer.weight.value, dw, loss, "linear dW");
    if (bias) expect_gradient(layer.bias.value, db, loss, "linear db");
  }
}

TEST(TrainLayers, RMSNormGradients) {
  RMSNorm<double> norm("n", 6);
  norm.gain.value = random_vector(6, 4);
  const int64_t rows = 5;
  std::vector<double> x = random_vector(rows * 6, 5), probe = random_vector(rows * 6, 6),
                      y(rows * 6), dx(rows * 6);
  auto loss = [&] {
    norm.forward(x.data(), rows, y.data());
    return dot(y, probe);
  };
  loss();
  norm.backward(x.data(), probe.data(), rows, dx.data());
  const std::vector<double> dg = norm.gain.grad;
  expect_gradient(x, dx, loss, "rmsnorm dx");
  expect_gradient(norm.gain.value, dg, loss, "rmsnorm dgain");
}

TEST(TrainLayers, RMSNormOutputHasUnitRms) {
  RMSNorm<double> norm("n", 8);
  std::vector<double> x = random_vector(8, 7, 5.0), y(8);
  norm.forward(x.data(), 1, y.data());
  EXPECT_NEAR(dot(y, y) / 8, 1.0, 1e-5);
}

TEST(TrainLayers, GeluDerivativeAndValues) {
  EXPECT_DOUBLE_EQ(gelu(0.0), 0.0);
  EXPECT_NEAR(gelu(1.0), 0.8411919906, 1e-9);  // tanh form of GELU(1)
  EXPECT_NEAR(gelu(-3.0), -0.0036373920, 1e-9);
  for (double x : {-3.0, -0.7, 0.0, 0.4, 2.5}) {
    const double h = 1e-6;
    EXPECT_NEAR(gelu_derivative(x), (gelu(x + h) - gelu(x - h)) / (2 * h), 1e-8) << x;
  }
}

TEST(TrainLayers, MLPGradients) {
  Rng rng(8);
  MLP<double> mlp("m", 4, 9, rng);
  const int64_t rows = 3;
  std::vector<double> x = random_vector(rows * 4, 9), probe = random_vector(rows * 4, 10),
                      y(rows * 4), dx(rows * 4);
  auto loss = [&] {
    mlp.forward(x.data(), rows, y.data());
    return dot(y, probe);
  };
  loss();
  mlp.backward(x.data(), probe.data(), rows, dx.data());
  const std::vector<double> up = mlp.up.weight.grad, up_b = mlp.up.bias.grad,
                            down = mlp.down.weight.grad;
  expect_gradient(x, dx, loss, "mlp dx");
  expect_gradient(mlp.up.weight.value, up, loss, "mlp up dW");
  expect_gradient(mlp.up.bias.value, up_b, loss, "mlp up db");
  expect_gradient(mlp.down.weight.value, down, loss, "mlp down dW");
}

TEST(TrainLayers, ShortConvGradientsAndCausality) {
  Rng rng(11);
  ShortConv<double> conv("c", 3, 4, rng);
  const int64_t batch = 2, tokens = 6;
  std::vector<double> x = random_vector(batch * tokens * 3, 12),
                      probe = random_vector(x.size(), 13), y(x.size()), dx(x.size());
  auto loss = [&] {
    conv.forward(x.data(), batch, tokens, y.data());
    return dot(y, probe);
  };
  loss();
  conv.backward(x.data(), probe.data(), batch, tokens, dx.data());
  const std::vector<double> dw = conv.weight.grad;
  expect_gradient(x, dx, loss, "conv dx");
  expect_gradient(conv.weight.value, dw, loss, "conv dw");
  // Changing token 3 of sample 0 leaves tokens 0..2 and all of sample 1 unchanged.
  conv.forward(x.data(), batch, tokens, y.data());
  const std::vector<double> before = y;
  x[3 * 3 + 1] += 1.0;
  conv.forward(x.data(), batch, tokens, y.data());
  for (size_t i = 0; i < y.size(); ++i)
    if (i < 3 * 3 || i >= size_t(tokens * 3)) {
      EXPECT_EQ(y[i], before[i]) << i;
    }
  EXPECT_NE(y[3 * 3 + 1], before[3 * 3 + 1]);
}

TEST(TrainLayers, EmbeddingGradientsAndRangeCheck) {
  Rng rng(14);
  TokenEmbedding<double> embed("e", 5, 3, rng);
  PositionEmbedding<double> positions("p", 4, 3, rng);
  const std::vector<int32_t> tokens{0, 4, 4, 2,
                                    1, 1, 3, 0};  // batch 2 x 4 tokens, repeats on purpose
  std::vector<double> probe = random_vector(8 * 3, 15), y(8 * 3);
  auto loss = [&] {
    embed.forward(tokens.data(), 8, y.data());
    positions.add_to(y.data(), 2);
    return dot(y, probe);
  };
  loss();
  embed.backward(tokens.data(), probe.data(), 8);
  positions.backward(probe.data(), 2);
  const std::vector<double> dt = embed.table.grad, dp = positions.table.grad;
  expect_gradient(embed.table.value, dt, loss, "token table");
  expect_gradient(positions.table.value, dp, loss, "positions");
  const int32_t bad = 5;
  EXPECT_THROW(embed.forward(&bad, 1, y.data()), Error);
}

TEST(TrainLayers, CrossEntropyGradientIgnoresUnlabelledRows) {
  const int64_t classes = 4;
  std::vector<double> logits = random_vector(3 * classes, 16);
  const std::vector<int32_t> targets{2, -1, 0};
  std::vector<double> grad;
  const LossResult r = cross_entropy(logits, targets, classes, &grad);
  EXPECT_EQ(r.labelled, 2);
  for (int64_t c = 0; c < classes; ++c) EXPECT_EQ(grad[size_t(classes + c)], 0.0);
  auto loss = [&] {
    return cross_entropy(logits, targets, classes, static_cast<std::vector<double>*>(nullptr)).loss;
  };
  expect_gradient(logits, grad, loss, "cross-entropy");
  // Uniform logits: loss log(C), no row correct unless argmax ties pick the target.
  std::vector<double> flat(2 * classes, 0.0);
  EXPECT_NEAR(cross_entropy(flat, {1, 3}, classes, static_cast<std::vector<double>*>(nullptr)).loss,
              std::log(4.0), 1e-12);
  EXPECT_THROW(cross_entropy(flat, {1, 4}, classes, static_cast<std::vector<double>*>(nullptr)),
               Error);
}

struct AttentionCase {
  const char* name;
  AttentionKind kind;
  bool causal;
  TokenLayout layout;
  int64_t conv;
  AttentionDesign design = {};
  int64_t dim = 6;  // 2 heads; rotary positions need an even head dimension
};

AttentionDesign design(MixingParam param, bool shared, FeatureMap phi, bool gated, bool rope,
                       int64_t value_conv) {
  AttentionDesign d;
  d.mixing_param = param;
  d.mixing_shared = shared;
  d.feature_map = phi;
  d.gated_head = gated;
  d.rope = rope;
  d.value_conv = value_conv;
  return d;
}

// Names the case in test listings instead of dumping its bytes.
void PrintTo(const AttentionCase& c, std::ostream* os) { *os << c.name; }

class AttentionGradients : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(AttentionGradients, MatchFiniteDifferences) {
  const AttentionCase& c = GetParam();
  Rng rng(17);
  AttentionLayer<double> layer("a", {c.kind, c.dim, 2, c.causal, c.layout, c.conv, c.design}, rng);
  if (c.kind == AttentionKind::mhla) {
    layer.mixing_parameter.value = random_vector(layer.mixing_parameter.value.size(), 18);
    // A directly learned W is positive (the normalised operator rejects negative entries).
    if (c.design.mixing_param == MixingParam::clamp)
      for (double& w : layer.mixing_parameter.value) w = 0.1 + std::abs(w);
  }
  const int64_t batch = 2, n = c.layout.num_tokens();
  std::vector<double> x = random_vector(size_t(batch * n * c.dim), 19),
                      probe = random_vector(x.size(), 20), y(x.size()), dx(x.size());
  auto loss = [&] {
    layer.forward(x.data(), batch, y.data());
    return dot(y, probe);
  };
  loss();
  layer.backward(x.data(), probe.data(), batch, dx.data());
  ParameterList<double> params;
  layer.collect(params);
  std::vector<std::vector<double>> grads;
  for (Parameter<double>* p : params) grads.push_back(p->grad);
  expect_gradient(x, dx, loss, "attention dx");
  for (size_t i = 0; i < params.size(); ++i)
    expect_gradient(params[i]->value, grads[i], loss, params[i]->name);
}

INSTANTIATE_TEST_SUITE_P(
    TrainLayers, AttentionGradients,
    ::testing::Values(
        AttentionCase{"softmax", AttentionKind::softmax, false, TokenLayout::sequence(7, 3), 0},
        AttentionCase{"softmax_causal_conv", AttentionKind::softmax, true,
                      TokenLayout::sequence(7, 3), 3},
        AttentionCase{"linear", AttentionKind::linear, false, TokenLayout::sequence(7, 3), 0},
        AttentionCase{"linear_causal", AttentionKind::linear, true, TokenLayout::sequence(7, 3), 2},
        AttentionCase{"mhla_ragged", AttentionKind::mhla, false, TokenLayout::sequence(7, 3), 0},
        AttentionCase{"mhla_causal_conv", AttentionKind::mhla, true, TokenLayout::sequence(8, 3),
                      3},
        AttentionCase{"mhla_grid2d", AttentionKind::mhla, false, TokenLayout::grid2d(3, 5, 2, 2),
                      0},
        // The paper's and the authors' options, each on at least once.
        AttentionCase{"mhla_clamp_shared_causal", AttentionKind::mhla, true,
                      TokenLayout::sequence(8, 3), 0,
                      design(MixingParam::clamp, true, FeatureMap::elu1, false, false, 0)},
        AttentionCase{"mhla_authors_lm_head", AttentionKind::mhla, true,
                      TokenLayout::sequence(7, 3), 2,
                      design(MixingParam::clamp, false, FeatureMap::relu, true, true, 0), 8},
        AttentionCase{"linear_gated_value_conv", AttentionKind::linear, true,
                      TokenLayout::sequence(7, 3), 0,
                      design(MixingParam::softmax, false, FeatureMap::elu1, true, false, 3)},
        AttentionCase{"mhla_grid2d_value_conv_shared", AttentionKind::mhla, false,
                      TokenLayout::grid2d(3, 5, 2, 2), 0,
                      design(MixingParam::softmax, true, FeatureMap::relu, false, false, 3)},
        AttentionCase{"softmax_rope_gated_value_conv", AttentionKind::softmax, false,
                      TokenLayout::grid2d(3, 4, 2, 2), 0,
                      design(MixingParam::softmax, false, FeatureMap::elu1, true, true, 3), 8}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(TrainLayers, MixingIsRowStochasticAndCausal) {
  Rng rng(21);
  AttentionLayer<double> layer(
      "a", {AttentionKind::mhla, 4, 2, true, TokenLayout::sequence(10, 3), 0, {}}, rng);
  layer.mixing_parameter.value = random_vector(layer.mixing_parameter.value.size(), 22, 30.0);
  const std::vector<double> w = layer.mixing();
  const int64_t m = 4;
  for (int64_t r = 0; r < 2 * m; ++r) {
    double sum = 0;
    for (int64_t b = 0; b < m; ++b) {
      const double e = w[size_t(r * m + b)];
      EXPECT_GE(e, 0.0);
      if (b > r % m) {
        EXPECT_EQ(e, 0.0);
      }
      sum += e;
    }
    EXPECT_NEAR(sum, 1.0, 1e-12);
  }
}

TEST(TrainLayers, MixingStartsAtTheLocalityInit) {
  Rng rng(23);
  AttentionLayer<double> layer(
      "a", {AttentionKind::mhla, 4, 1, false, TokenLayout::grid2d(4, 4, 2, 2), 0, {}}, rng);
  const std::vector<double> w = layer.mixing();
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t b = 0; b < 4; ++b)
      if (b != i) {
        EXPECT_GT(w[size_t(i * 4 + i)], w[size_t(i * 4 + b)]);
      }
}

TEST(TrainLayers, MhlaWithUniformMixingIsLinearAttention) {
  // Equal weights on every readable block cancel in the normalisation, so MHLA
  // starts as linear attention (the same projections: same seed), up to the
  // eps = 1e-6 in the denominator, which meets a W-scaled z in MHLA.
  for (bool causal : {false, true}) {
    const TokenLayout layout = TokenLayout::sequence(11, 3);
    Rng rng_a(31), rng_b(31);
    AttentionConfig mhla{AttentionKind::mhla, 6, 2, causal, layout, 2, {}};
    mhla.design.mixing_init = MixingTransform::uniform;
    AttentionConfig linear = mhla;
    linear.kind = AttentionKind::linear;
    AttentionLayer<double> a("a", mhla, rng_a), b("a", linear, rng_b);
    const std::vector<double> x = random_vector(2 * 11 * 6, 32);
    std::vector<double> ya(x.size()), yb(x.size());
    a.forward(x.data(), 2, ya.data());
    b.forward(x.data(), 2, yb.data());
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(ya[i], yb[i], 1e-7) << i;
  }
}

TEST(TrainLayers, ClampedMixingStartsAtTheInitAndIsCausal) {
  // Uniform-causal init: row i reads blocks 0..i with weight 1/(i+1), the
  // authors' language-model start; nothing above the diagonal.
  Rng rng(41);
  AttentionConfig c{AttentionKind::mhla, 4, 2, true, TokenLayout::sequence(10, 3), 0, {}};
  c.design.mixing_param = MixingParam::clamp;
  c.design.mixing_init = MixingTransform::uniform;
  c.design.mixing_lr_scale = 10;
  AttentionLayer<double> layer("a", c, rng);
  EXPECT_EQ(layer.mixing_parameter.lr_scale, 10);
  EXPECT_EQ(layer.mixing_parameter.lower, 1e-5);
  EXPECT_EQ(layer.mixing_parameter.upper, 1.0);
  const std::vector<double> w = layer.mixing();
  const int64_t m = 4;
  ASSERT_EQ(w.size(), size_t(2 * m * m));
  for (int64_t r = 0; r < 2 * m; ++r)
    for (int64_t b = 0; b < m; ++b)  // init_mixing works in float
      EXPECT_NEAR(w[size_t(r * m + b)], b <= r % m ? 1.0 / double(r % m + 1) : 0.0, 1e-7);
  c.design.mixing_shared = true;
  AttentionLayer<double> shared("s", c, rng);
  EXPECT_EQ(shared.mixing_parameter.shape, (std::vector<int64_t>{1, m, m}));
}

TEST(TrainLayers, RotaryPositionsAreRelativeAndInvertible) {
  const int64_t tokens = 9, heads = 2, dh = 6;
  const std::vector<double> x = random_vector(size_t(tokens * heads * dh), 42);
  std::vector<double> r = x;
  rotate_positions(r.data(), 1, tokens, heads, dh, false);
  // Token 0 is not turned; every token keeps its norm.
  for (int64_t j = 0; j < heads * dh; ++j) EXPECT_DOUBLE_EQ(r[size_t(j)], x[size_t(j)]);
  // The same vector at positions t and s: the rotated dot product depends on t - s only.
  std::vector<double> same(size_t(tokens * heads * dh));
  for (int64_t t = 0; t < tokens; ++t)
    std::copy(x.begin(), x.begin() + dh, same.begin() + t * heads * dh);
  rotate_positions(same.data(), 1, tokens, heads, dh, false);
  auto dot_at = [&](int64_t t, int64_t s) {
    double d = 0;
    for (int64_t j = 0; j < dh; ++j)
      d += same[size_t(t * heads * dh + j)] * same[size_t(s * heads * dh + j)];
    return d;
  };
  EXPECT_NEAR(dot_at(3, 1), dot_at(7, 5), 1e-12);
  EXPECT_NEAR(dot_at(4, 4), dot_at(0, 0), 1e-12);
  rotate_positions(r.data(), 1, tokens, heads, dh, true);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(r[i], x[i], 1e-12);
  EXPECT_THROW(rotate_positions(r.data(), 1, 1, 1, 3, false), Error);
}

TEST(TrainLayers, GridConvWithACentreTapIsTheIdentity) {
  Rng rng(43);
  GridConv<double> conv("c", 2, 3, rng);
  std::fill(conv.weight.value.begin(), conv.weight.value.end(), 0.0);
  conv.weight.value[4] = conv.weight.value[9 + 4] = 1.0;  // centre of each channel's 3 x 3
  const std::vector<double> x = random_vector(2 * 3 * 4 * 2, 44);
  std::vector<double> y(x.size());
  conv.forward(x.data(), 2, 3, 4, y.data());
  EXPECT_EQ(y, x);
  EXPECT_THROW(GridConv<double>("even", 2, 2, rng), Error);
}

// The whole model: embeddings, blocks with every attention kind, final norm, head.
TEST(TrainLayers, ModelGradientsTokensAndPatches) {
  for (bool patches : {false, true}) {
    ModelConfig c;
    c.dim = 6;
    c.heads = 2;
    c.mlp_hidden = 5;
    c.classes = 4;
    c.attention = {AttentionKind::mhla, AttentionKind::softmax, AttentionKind::linear};
    if (patches) {
      c.patch_dim = 3;
      c.pool = true;
      c.layout = TokenLayout::grid2d(3, 3, 2, 2);
    } else {
      c.vocab = 7;
      c.causal = true;
      c.conv_kernel = 2;
      c.layout = TokenLayout::sequence(5, 2);
    }
    Model<double> model(c, 24);
    const int64_t batch = 2, n = c.layout.num_tokens();
    std::vector<int32_t> tokens;
    std::vector<double> patch_values;
    if (patches) {
      patch_values = random_vector(size_t(batch * n * 3), 25);
    } else {
      for (int64_t i = 0; i < batch * n; ++i) tokens.push_back(int32_t((i * 5 + 1) % 7));
    }
    const ModelInput<double> input{patches ? nullptr : tokens.data(),
                                   patches ? patch_values.data() : nullptr};
    const std::vector<double> probe = random_vector(size_t((patches ? batch : batch * n) * 4), 26);
    auto loss = [&] { return dot(model.forward(input, batch), probe); };
    loss();
    model.zero_grad();
    model.backward(input, probe.data(), batch);
    std::vector<std::vector<double>> grads;
    for (Parameter<double>* p : model.parameters()) grads.push_back(p->grad);
    for (size_t i = 0; i < grads.size(); ++i)
      expect_gradient(model.parameters()[i]->value, grads[i], loss, model.parameters()[i]->name,
                      12);
  }
}

TEST(TrainLayers, ModelRejectsBadConfigs) {
  ModelConfig c;
  c.classes = 3;
  c.layout = TokenLayout::sequence(4, 2);
  c.attention = {AttentionKind::mhla};
  EXPECT_THROW(Model<float>(c, 0), Error);  // neither vocab nor patches
  c.vocab = 5;
  c.heads = 5;
  EXPECT_THROW(Model<float>(c, 0), Error);  // 64 not divisible by 5
}

}  // namespace
}  // namespace mhla::train::test
