// Column and float-update math of kernel_math.h against float64 formulas, and the CPU backend's
// column ops (copies, permutations, signs, sums down columns) against direct loops. The CUDA
// kernels run the same kmath functions; the descending sort is also checked in rank form.
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

TEST(ColumnMath, LerpIsTorchsTwoBranchForm) {
  const float a = 1.5f, b = -0.25f;
  EXPECT_EQ(kmath::lerp(a, b, 0.0f), a);
  EXPECT_EQ(kmath::lerp(a, b, 1.0f), b);  // the upper branch lands on b exactly
  for (float w : {0.05f, 0.3f, 0.5f, 0.7f, 0.95f}) {
    const double want = a + static_cast<double>(w) * (static_cast<double>(b) - a);
    EXPECT_NEAR(kmath::lerp(a, b, w), want, 1e-6) << "w = " << w;
  }
  EXPECT_EQ(kmath::add_scaled(2.0f, -0.5f, 3.0f), 0.5f);
}

TEST(ColumnMath, ColumnDotSumsDownAColumnInFloat64) {
  const int64_t rows = 50, cols = 7;
  auto a = random_vector(rows * cols, 1), b = random_vector(rows * cols, 2);
  for (int64_t j = 0; j < cols; ++j) {
    double want = 0;
    for (int64_t i = 0; i < rows; ++i)
      want += static_cast<double>(a[i * cols + j]) * b[i * cols + j];
    EXPECT_EQ(kmath::column_dot(a.data(), b.data(), rows, cols, j), static_cast<float>(want));
  }
}

TEST(ColumnMath, DescendingRanksAreTheStableSortWithNanLast) {
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

// The eigenvector sign convention: a column is negated when its largest-magnitude entry (the
// lowest row on ties) is negative; a basis and its sign-flipped copy end up equal.
TEST(CpuColumnOps, ColumnSignsFollowTheLargestEntry) {
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

TEST(CpuColumnOps, CopiesIdentityAndColumnPermutations) {
  Backend& cpu = cpu_backend();
  // Matrix j of x [b, m, n] into column block j of s [m, b n], and back (a stack of matrices).
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

TEST(CpuColumnOps, LerpAndAddScaledAreTheKernelMath) {
  Backend& cpu = cpu_backend();
  const int64_t n = 40000;  // above the parallel threshold
  auto a = random_vector(n, 6), b = random_vector(n, 7);
  std::vector<float> lerped = a;
  cpu.lerp(lerped.data(), b.data(), 0.8f, n);
  std::vector<float> scaled = a;
  cpu.add_scaled(scaled.data(), 0.25f, b.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(lerped[i], kmath::lerp(a[i], b[i], 0.8f));
    EXPECT_EQ(scaled[i], kmath::add_scaled(a[i], 0.25f, b[i]));
  }
}

TEST(CpuColumnOps, ReductionsRunInIndexOrder) {
  Backend& cpu = cpu_backend();
  const int64_t n = 50000;
  auto x = random_vector(n, 11);
  double want = 0;
  for (float e : x)
    want += static_cast<double>(e) * e;
  EXPECT_EQ(cpu.sum_squares_in_order(x.data(), n), want);
  const int64_t rows = 30, cols = 4;
  std::vector<float> dots(cols);
  cpu.column_dots(dots.data(), x.data(), x.data() + rows * cols, rows, cols);
  for (int64_t j = 0; j < cols; ++j)
    EXPECT_EQ(dots[j], kmath::column_dot(x.data(), x.data() + rows * cols, rows, cols, j));
}

}  // namespace
}  // namespace core
