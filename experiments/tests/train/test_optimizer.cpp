// AdamW, the learning-rate schedule and gradient clipping, against the formulas.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "train/optimizer.hpp"

namespace mhla::train {
namespace {

TEST(TrainOptimizer, AdamWFirstStepsMatchTheFormula) {
  Parameter<double> w("w", {2}), b("b", {1}, /*decay=*/false);
  w.value = {1.0, -2.0};
  b.value = {0.5};
  AdamW<double> adam({&w, &b}, {0.1, 0.9, 0.99, 1e-8, 0.5});
  w.grad = {0.2, -0.4};
  b.grad = {3.0};
  adam.step(0.1);
  // Step 1: m/c1 = g, v/c2 = g^2, so the update is lr * g/|g| (+ eps); w also decays by lr * wd.
  EXPECT_NEAR(w.value[0], 1.0 * (1 - 0.05) - 0.1, 1e-7);  // eps moves it by 5e-9
  EXPECT_NEAR(w.value[1], -2.0 * (1 - 0.05) + 0.1, 1e-7);
  EXPECT_NEAR(b.value[0], 0.5 - 0.1, 1e-9);  // no decay on a bias
  w.grad = {0.0, 0.0};
  b.grad = {0.0};
  const double before = w.value[0];
  adam.step(0.1);
  // Step 2 with zero gradient: m = 0.9*0.02*... ; the moments still move the weight.
  const double m = 0.9 * 0.1 * 0.2, v = 0.99 * 0.01 * 0.04;
  const double expected =
      before * (1 - 0.05) - 0.1 * (m / (1 - 0.81)) / (std::sqrt(v / (1 - 0.9801)) + 1e-8);
  EXPECT_NEAR(w.value[0], expected, 1e-9);
  EXPECT_EQ(adam.steps_taken(), 2);
}

TEST(TrainOptimizer, LearningRateScaleAndBounds) {
  // A first Adam step moves every entry by lr * sign(g): ten times as far with
  // lr_scale 10; the bounds then hold whatever the step.
  Parameter<double> plain("p", {1}, false), scaled("s", {3}, false);
  scaled.lr_scale = 10;
  scaled.lower = 1e-5;
  scaled.upper = 1.0;
  plain.value = {0.5};
  scaled.value = {0.5, 0.5, 0.99};
  AdamW<double> adam({&plain, &scaled}, {0.01, 0.9, 0.999, 1e-12, 0.0});
  plain.grad = {1.0};
  scaled.grad = {1.0, -1.0, -1.0};
  adam.step(0.01);
  EXPECT_NEAR(plain.value[0], 0.49, 1e-9);
  EXPECT_NEAR(scaled.value[0], 0.4, 1e-9);
  EXPECT_NEAR(scaled.value[1], 0.6, 1e-9);
  EXPECT_EQ(scaled.value[2], 1.0);  // 1.09 clamped
  scaled.grad = {1e3, 0.0, 0.0};
  for (int i = 0; i < 50; ++i) adam.step(0.01);
  EXPECT_EQ(scaled.value[0], 1e-5);
}

TEST(TrainOptimizer, WarmupThenCosine) {
  EXPECT_DOUBLE_EQ(scheduled_lr(0, 100, 10, 1.0, 0.1), 0.1);
  EXPECT_DOUBLE_EQ(scheduled_lr(9, 100, 10, 1.0, 0.1), 1.0);
  EXPECT_DOUBLE_EQ(scheduled_lr(10, 100, 10, 1.0, 0.1), 1.0);
  EXPECT_NEAR(scheduled_lr(99, 100, 10, 1.0, 0.1), 0.1, 1e-12);
  // Half way through the decay: the mean of peak and floor.
  const double mid = scheduled_lr(10 + 89 / 2, 100, 10, 1.0, 0.1);
  EXPECT_NEAR(mid, 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 44.0 / 89.0)), 1e-12);
  for (int64_t s = 11; s < 100; ++s)
    EXPECT_LE(scheduled_lr(s, 100, 10, 1.0, 0.1), scheduled_lr(s - 1, 100, 10, 1.0, 0.1));
}

TEST(TrainOptimizer, ClippingScalesToTheNormAndOnlyAboveIt) {
  Parameter<double> a("a", {2}), b("b", {1});
  a.grad = {3.0, 0.0};
  b.grad = {4.0};
  EXPECT_DOUBLE_EQ(clip_grad_norm<double>({&a, &b}, 10.0), 5.0);
  EXPECT_DOUBLE_EQ(a.grad[0], 3.0);  // below the limit: unchanged
  EXPECT_DOUBLE_EQ(clip_grad_norm<double>({&a, &b}, 1.0), 5.0);
  EXPECT_NEAR(a.grad[0], 0.6, 1e-12);
  EXPECT_NEAR(b.grad[0], 0.8, 1e-12);
}

}  // namespace
}  // namespace mhla::train
