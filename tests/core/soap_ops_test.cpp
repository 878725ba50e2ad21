// The SOAP family's shared math (kernel_math.h, "SOAP family") against float64 formulas, and the
// CPU backend's SOAP-family operations against direct loops. The CUDA kernels run the same kmath
// functions; the descending sort here is also checked in the form the CUDA kernel uses (ranks).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "core/backend.h"
#include "core/check.h"
#include "core/kernel_math.h"
#include "core/rng.h"
#include "tests/backend_test_data.h"

namespace core {
namespace {

using test_data::random_vector;

TEST(SoapMath, LerpIsTorchsTwoBranchForm) {
  const float a = 1.5f, b = -0.25f;
  EXPECT_EQ(kmath::soap_lerp(a, b, 0.0f), a);
  EXPECT_EQ(kmath::soap_lerp(a, b, 1.0f), b);  // the upper branch lands on b exactly
  for (float w : {0.05f, 0.3f, 0.5f, 0.7f, 0.95f}) {
    const double want = a + static_cast<double>(w) * (static_cast<double>(b) - a);
    EXPECT_NEAR(kmath::soap_lerp(a, b, w), want, 1e-6) << "w = " << w;
  }
  EXPECT_EQ(kmath::soap_add_scaled(2.0f, -0.5f, 3.0f), 0.5f);
}

TEST(SoapMath, KlInverseWeightClampsAtEps) {
  EXPECT_EQ(kmath::kl_inverse_weight(2.0f, 1e-3, 4), static_cast<float>(1.0 / 4 / 2.0));
  EXPECT_EQ(kmath::kl_inverse_weight(-1.0f, 1e-3, 4), static_cast<float>(1.0 / 4 / 1e-3));
  EXPECT_EQ(kmath::kl_inverse_weight(0.0f, 1e-3, 4), static_cast<float>(1.0 / 4 / 1e-3));
  EXPECT_TRUE(std::isnan(kmath::kl_inverse_weight(std::nanf(""), 1e-3, 4)));  // as std::max
}

TEST(SoapMath, ColumnDotSumsDownAColumnInFloat64) {
  const int64_t rows = 50, cols = 7;
  auto a = random_vector(rows * cols, 1), b = random_vector(rows * cols, 2);
  for (int64_t j = 0; j < cols; ++j) {
    double want = 0;
    for (int64_t i = 0; i < rows; ++i)
      want += static_cast<double>(a[i * cols + j]) * b[i * cols + j];
    EXPECT_EQ(kmath::column_dot(a.data(), b.data(), rows, cols, j), static_cast<float>(want));
  }
}

TEST(SoapMath, DescendingRanksAreTheStableSortWithNanLast) {
  for (int64_t n : {1, 2, 9, 300}) {
    auto x = random_vector(n, 3 + n);
    for (float& v : x)
      v = std::round(2.0f * v) / 2.0f;  // ties
    if (n > 2) {
      x[0] = std::nanf("");
      x[n - 1] = std::nanf("");
      x[1] = INFINITY;
    }
    // The rank form (the CUDA kernel's) places every element once.
    std::vector<int32_t> by_rank(n, -1);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t r = kmath::descending_rank(x.data(), n, j);
      ASSERT_TRUE(r >= 0 && r < n && by_rank[r] == -1) << "n = " << n << ", j = " << j;
      by_rank[r] = static_cast<int32_t>(j);
    }
    // The CPU backend's stable sort gives the same order.
    std::vector<int32_t> order(n);
    cpu_backend().argsort_descending(order.data(), x.data(), n);
    EXPECT_EQ(order, by_rank) << "n = " << n;
    // Non-increasing, ties by index, NaN at the end.
    for (int64_t k = 1; k < n; ++k) {
      const float p = x[order[k - 1]], c = x[order[k]];
      if (std::isnan(c)) {
        EXPECT_TRUE(!std::isnan(p) || order[k - 1] < order[k]);
      } else {
        ASSERT_FALSE(std::isnan(p)) << "a NaN before a number at " << k;
        EXPECT_TRUE(p > c || (p == c && order[k - 1] < order[k])) << "at " << k;
      }
    }
  }
}

TEST(SoapMath, AdamInTheEigenbasisAgainstFloat64) {
  kmath::SoapAdamStep s;
  s.beta1 = 0.9f, s.beta2 = 0.95f, s.w1 = 0.1f, s.w2 = 0.05f, s.eps = 1e-8f;
  s.c1 = 0.271f, s.c2 = 0.142625f, s.cn = 0.3439f;
  const float g = 0.3f, m0 = 0.02f, v0 = 0.004f;
  for (bool nesterov : {false, true}) {
    s.raw = false;
    s.nesterov = nesterov;
    float m = m0, v = v0;
    const float d = kmath::soap_adam_corrected(m, v, g, g * g, s);
    const double mw = m0 + 0.1 * (g - m0), vw = v0 + 0.05 * (static_cast<double>(g) * g - v0);
    const double num = nesterov ? 0.9 * mw / 0.3439 + 0.1 * g / 0.271 : mw / 0.271;
    EXPECT_NEAR(m, mw, 1e-7);
    EXPECT_NEAR(v, vw, 1e-8);
    EXPECT_NEAR(d, num / (std::sqrt(vw / 0.142625) + 1e-8), 1e-5) << "nesterov " << nesterov;
  }
  s.raw = true;
  float m = m0, v = v0;
  const float d = kmath::soap_adam_raw(m, v, g, s);
  const double mw = 0.9 * m0 + 0.1 * g, vw = 0.95 * v0 + 0.05 * static_cast<double>(g) * g;
  EXPECT_NEAR(m, mw, 1e-7);
  EXPECT_NEAR(v, vw, 1e-8);
  EXPECT_NEAR(d, mw / (std::sqrt(vw) + 1e-8), 1e-5);
}

TEST(SoapMath, RmsClipScale) {
  EXPECT_NEAR(kmath::soap_rms_clip_scale(4.0 * 100, 100, 1.0), 1.0 / (2.0 + 1e-7), 1e-7);
  EXPECT_EQ(kmath::soap_rms_clip_scale(4.0 * 100, 100, 3.0), 1.0f);  // below the limit: 1
}

// The eigenvector sign convention: a column is negated when its largest-magnitude entry (the
// lowest row on ties) is negative; a basis and its sign-flipped copy end up equal.
TEST(SoapCpuOps, ColumnSignsFollowTheLargestEntry) {
  // [3, 4]: column 0 largest -3 (flip), 1 largest 2 (keep), 2 tie |-1| and 1 -> the first,
  // -1 (flip), 3 all zero (keep).
  std::vector<float> q = {-3, 0.5f, -1, 0, 1, 2, 1, 0, 2, -1, 0.5f, 0};
  EXPECT_TRUE(kmath::column_sign_flips(q.data(), 3, 4, 0));
  EXPECT_FALSE(kmath::column_sign_flips(q.data(), 3, 4, 1));
  EXPECT_TRUE(kmath::column_sign_flips(q.data(), 3, 4, 2));
  EXPECT_FALSE(kmath::column_sign_flips(q.data(), 3, 4, 3));
  cpu_backend().canonicalize_column_signs(q.data(), 3, 4);
  EXPECT_EQ(q, (std::vector<float>{3, 0.5f, 1, 0, -1, 2, -1, 0, -2, -1, -0.5f, 0}));

  std::vector<float> a = random_vector(6 * 5, 7), b(6 * 5);
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t j = 0; j < 5; ++j)
      b[i * 5 + j] = j % 2 ? -a[i * 5 + j] : a[i * 5 + j];
  cpu_backend().canonicalize_column_signs(a.data(), 6, 5);
  cpu_backend().canonicalize_column_signs(b.data(), 6, 5);
  EXPECT_EQ(a, b);
}

TEST(SoapCpuOps, CopiesIdentityAndColumnPermutations) {
  Backend& cpu = cpu_backend();
  // Matrix j of x [b, m, n] into column block j of s [m, b n], and back (StackedSoap's stack).
  const int64_t b = 3, m = 4, n = 5;
  auto x = random_vector(b * m * n, 4);
  std::vector<float> s(m * b * n), back(b * m * n);
  for (int64_t j = 0; j < b; ++j)
    cpu.copy_block_2d(s.data() + j * n, b * n, x.data() + j * m * n, n, m, n);
  for (int64_t j = 0; j < b; ++j)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t k = 0; k < n; ++k)
        EXPECT_EQ(s[i * b * n + j * n + k], x[(j * m + i) * n + k]);
  for (int64_t j = 0; j < b; ++j)
    cpu.copy_block_2d(back.data() + j * m * n, n, s.data() + j * n, b * n, m, n);
  EXPECT_EQ(back, x);
  EXPECT_THROW(cpu.copy_block_2d(s.data(), 2, x.data(), n, m, 3), Error);  // stride < columns

  std::vector<float> q = random_vector(9, 5);
  cpu.set_identity(q.data(), 3);
  EXPECT_EQ(q, (std::vector<float>{1, 0, 0, 0, 1, 0, 0, 0, 1}));

  const std::vector<float> a = {1, 2, 3, 4, 5, 6};  // [2, 3]
  std::vector<float> out(6);
  cpu.reverse_columns(out.data(), a.data(), 2, 3);
  EXPECT_EQ(out, (std::vector<float>{3, 2, 1, 6, 5, 4}));
  const std::vector<int32_t> order = {1, 2, 0};
  cpu.gather_columns(out.data(), a.data(), order.data(), 2, 3);
  EXPECT_EQ(out, (std::vector<float>{2, 3, 1, 5, 6, 4}));
  const std::vector<int32_t> bad = {0, 3, 1};
  EXPECT_THROW(cpu.gather_columns(out.data(), a.data(), bad.data(), 2, 3), Error);
}

TEST(SoapCpuOps, ElementwiseOpsAreTheKernelMath) {
  Backend& cpu = cpu_backend();
  const int64_t n = 40000;  // above the parallel threshold
  auto a = random_vector(n, 6), b = random_vector(n, 7), m = random_vector(n, 8, 0.1f);
  auto v = random_vector(n, 9, 0.1f), g = random_vector(n, 10);
  for (float& e : v)
    e *= e;
  std::vector<float> lerped = a;
  cpu.lerp(lerped.data(), b.data(), 0.8f, n);
  std::vector<float> scaled = a;
  cpu.add_scaled(scaled.data(), 0.25f, b.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(lerped[i], kmath::soap_lerp(a[i], b[i], 0.8f));
    EXPECT_EQ(scaled[i], kmath::soap_add_scaled(a[i], 0.25f, b[i]));
  }
  for (bool raw : {true, false}) {
    kmath::SoapAdamStep s;
    s.raw = raw;
    s.c1 = 0.5f, s.c2 = 0.25f;
    std::vector<float> mm = m, vv = v, d(n);
    cpu.soap_adam(d.data(), mm.data(), vv.data(), g.data(), n, s);
    for (int64_t i = 0; i < n; i += 97) {
      float me = m[i], ve = v[i];
      volatile float g2 = g[i] * g[i];  // rounded on its own, as the op forms it
      const float de = raw ? kmath::soap_adam_raw(me, ve, g[i], s)
                           : kmath::soap_adam_corrected(me, ve, g[i], g2, s);
      EXPECT_EQ(mm[i], me) << i;
      EXPECT_EQ(vv[i], ve) << i;
      EXPECT_EQ(d[i], de) << i;
    }
  }
}

TEST(SoapCpuOps, ReductionsRunInIndexOrder) {
  Backend& cpu = cpu_backend();
  const int64_t n = 50000;
  auto x = random_vector(n, 11);
  double want = 0;
  for (float e : x)
    want += static_cast<double>(e) * e;
  EXPECT_EQ(cpu.sum_squares_in_order(x.data(), n), want);
  std::vector<float> d = x;
  cpu.clip_update_rms(d.data(), n, 0.5);
  const float s = kmath::soap_rms_clip_scale(want, n, 0.5);
  EXPECT_LT(s, 1.0f);
  for (int64_t i = 0; i < n; i += 101)
    EXPECT_EQ(d[i], x[i] * s);
  const int64_t rows = 30, cols = 4;
  std::vector<float> dots(cols);
  cpu.column_dots(dots.data(), x.data(), x.data() + rows * cols, rows, cols);
  for (int64_t j = 0; j < cols; ++j)
    EXPECT_EQ(dots[j], kmath::column_dot(x.data(), x.data() + rows * cols, rows, cols, j));
}

}  // namespace
}  // namespace core
