// The NaN-proof difference measures (core/compare.h) and the test helpers built on them
// (grad_check.h): a NaN on either side and a value just above the tolerance must fail.
#include "core/compare.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "grad_check.h"

namespace {

using core::test::expect_gradient;
using core::test::expect_within;
using core::test::kGradTol;

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

TEST(Compare, MeasuresOfKnownVectors) {
  const std::vector<double> a = {1.0, 2.0, 2.0}, b = {1.0, 2.0, 4.0};
  const core::Difference d = core::compare(a, b);
  EXPECT_DOUBLE_EQ(d.norm_rel(), 2.0 / std::sqrt(21.0));
  EXPECT_DOUBLE_EQ(d.max_abs(), 2.0);
  EXPECT_DOUBLE_EQ(d.max_rel(), 0.5);
  EXPECT_EQ(d.worst_index(), 2);
  // ulp of 4 in float is 2^-21: a difference of one float step at 4 is 1 ulp.
  const std::vector<float> f = {std::nextafter(4.0f, 5.0f)};
  EXPECT_DOUBLE_EQ(core::compare(f, std::vector<double>{4.0}).max_ulp(), 1.0);
  EXPECT_DOUBLE_EQ(core::ulp_f32(4.0), std::ldexp(1.0, -21));
  EXPECT_EQ(core::compare(a, a).norm_rel(), 0.0);
}

TEST(Compare, NonFiniteOnEitherSideIsInfinitelyFar) {
  for (double bad : {kNan, kInf, -kInf}) {
    for (bool in_reference : {false, true}) {
      std::vector<double> a = {1.0, 2.0, 3.0}, b = a;
      (in_reference ? b : a)[1] = bad;
      const core::Difference d = core::compare(a, b);
      EXPECT_EQ(d.norm_rel(), kInf);
      EXPECT_EQ(d.max_abs(), kInf);
      EXPECT_EQ(d.max_rel(), kInf);
      EXPECT_EQ(d.max_ulp(), kInf);
      EXPECT_EQ(d.nonfinite(), 1);
      EXPECT_EQ(d.worst_index(), 1);
      EXPECT_FALSE(core::within(d.max_abs(), 1e30));
    }
  }
  EXPECT_FALSE(core::within(kNan, 1.0));
  EXPECT_EQ(core::compare(std::vector<double>{1.0}, std::vector<double>{1.0, 2.0}).max_abs(),
            kInf);  // a size mismatch too
}

TEST(Compare, ExpectWithinFailsOnNanAndJustAbove) {
  EXPECT_NONFATAL_FAILURE(expect_within("nan", kNan, 1e-6), "nan: error nan above");
  EXPECT_NONFATAL_FAILURE(expect_within("above", std::nextafter(1e-6, 1.0), 1e-6), "above");
  expect_within("at the tolerance", 1e-6, 1e-6);
}

// A quadratic loss sum x_i^2 / 2 has the exact gradient x, and central differences reproduce it
// to rounding: an analytic gradient off by 1.5x the tolerance (norm-relative) must fail, one off
// by half of it must pass, and a NaN in the gradient or in the loss must fail.
TEST(Compare, ExpectGradientFailsOnNanAndJustAboveTolerance) {
  std::vector<double> x = core::test::random_vec(50, 7);
  auto loss = [&] {
    double s = 0;
    for (double v : x)
      s += 0.5 * v * v;
    return s;
  };
  auto scaled = [&](double f) {
    std::vector<double> g = x;
    for (double& v : g)
      v *= f;
    return g;
  };
  expect_gradient("exact", x, loss, x);
  expect_gradient("half the tolerance off", x, loss, scaled(1 + 0.5 * kGradTol));
  EXPECT_NONFATAL_FAILURE(
      expect_gradient("1.5 tolerances off", x, loss, scaled(1 + 1.5 * kGradTol)),
      "1.5 tolerances off");
  std::vector<double> nan_grad = x;
  nan_grad[17] = kNan;
  EXPECT_NONFATAL_FAILURE(expect_gradient("nan gradient", x, loss, nan_grad), "element 17");
  auto nan_loss = [&] { return x[3] > 10.0 ? 0.0 : kNan; };
  EXPECT_NONFATAL_FAILURE(expect_gradient("nan loss", x, nan_loss, x), "nan loss");
}

}  // namespace
