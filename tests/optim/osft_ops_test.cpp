// The OSFT element formulas of osft_math.h (which the CUDA ops evaluate) against the CPU OSFT ops
// (Eigen's float64 products): both sum in float64 and round once, so
// they agree to within a float rounding step. Also the ops' contracts: accumulation, a block of
// rows, in-place projection, empty shards.
#include "optim/osft/osft_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

#include "core/rng.h"
#include "optim/osft/osft_math.h"
#include "tests/backend_test_data.h"

namespace optim {
namespace {

using test_data::random_vector;

// Largest |got - want| / max(1, |want|); a NaN makes it infinite.
template <typename T>
double max_rel_error(const std::vector<T>& got, const std::vector<T>& want) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double d = std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i])) /
                     std::max(1.0, std::abs(static_cast<double>(want[i])));
    if (!(d <= worst)) worst = std::isnan(d) ? INFINITY : d;
  }
  return worst;
}

// One rounding of a float64 sum, whose order differs between the two: a few float ulps.
constexpr double kFloatTol = 1e-6;

OsftOps& cpu_ops() {
  static const std::unique_ptr<OsftOps> ops = make_osft_ops(core::cpu_backend());
  return *ops;
}

using Shape3 = std::tuple<int64_t, int64_t, int64_t>;  // n, m, k
const Shape3 kShapes[] = {{32, 32, 24}, {24, 64, 12}, {64, 16, 11}, {300, 20, 7}, {5, 9, 1}};

TEST(OsftOps, ReconstructMatchesTheElementFormula) {
  uint64_t seed = 10;
  for (auto [n, m, k] : kShapes) {
    const test_data::OsftFactors f(n, m, k, seed += 10);
    std::vector<float> w(static_cast<size_t>(n * m)), want(w.size());
    cpu_ops().reconstruct(w.data(), f.u_high.data(), f.s_high.data(), f.v_high.data(),
                          f.u_low.data(), f.s_low.data(), f.v_low.data(), n, m, k, f.r);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j)
        want[static_cast<size_t>(i * m + j)] = kmath::osft_dense_element(
            f.u_high.data(), f.s_high.data(), f.v_high.data(), f.u_low.data(), f.s_low.data(),
            f.v_low.data(), m, k, f.r, i, j);
    EXPECT_LE(max_rel_error(w, want), kFloatTol) << n << "x" << m << " k " << k;

    // A block of rows: the factors' pointers advanced to its first row.
    const int64_t begin = n / 3, rows = n - n / 3 - 1;
    std::vector<float> block(static_cast<size_t>(rows * m));
    cpu_ops().reconstruct(block.data(), f.u_high.data() + begin * k, f.s_high.data(),
                          f.v_high.data(), f.u_low.data() + begin * f.r, f.s_low.data(),
                          f.v_low.data(), rows, m, k, f.r);
    EXPECT_TRUE(std::equal(block.begin(), block.end(), w.begin() + begin * m));
  }
}

TEST(OsftOps, FactorGradsAccumulateTheElementFormulas) {
  uint64_t seed = 100;
  for (auto [n, m, k] : kShapes) {
    const test_data::OsftFactors f(n, m, k, seed += 10);
    const int64_t r = f.r;
    const std::vector<float> dw = random_vector(n * m, seed + 7);
    // Nonzero starting gradients: the op adds to them.
    const std::vector<float> du0 = random_vector(n * r, seed + 8), ds0 = random_vector(r, seed + 9),
                             dv0 = random_vector(r * m, seed + 6);
    std::vector<float> du = du0, ds = ds0, dv = dv0;
    cpu_ops().factor_grads(du.data(), ds.data(), dv.data(), dw.data(), f.u_low.data(),
                           f.s_low.data(), f.v_low.data(), n, m, r);
    std::vector<float> want_u = du0, want_s = ds0, want_v = dv0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < r; ++j)
        want_u[static_cast<size_t>(i * r + j)] +=
            kmath::osft_grad_u_element(dw.data(), f.v_low.data(), f.s_low.data(), m, i, j);
    for (int64_t j = 0; j < r; ++j) {
      want_s[static_cast<size_t>(j)] +=
          kmath::osft_grad_s_element(dw.data(), f.u_low.data(), f.v_low.data(), n, m, r, j);
      for (int64_t c = 0; c < m; ++c)
        want_v[static_cast<size_t>(j * m + c)] +=
            kmath::osft_grad_v_element(dw.data(), f.u_low.data(), f.s_low.data(), n, m, r, j, c);
    }
    EXPECT_LE(max_rel_error(du, want_u), kFloatTol) << n << "x" << m;
    EXPECT_LE(max_rel_error(ds, want_s), kFloatTol) << n << "x" << m;
    EXPECT_LE(max_rel_error(dv, want_v), kFloatTol) << n << "x" << m;
    // The terms are not small next to the starting values (so the comparison tests them).
    EXPECT_GT(max_rel_error(du, du0), 1e-2);
    EXPECT_GT(max_rel_error(ds, ds0), 1e-2);
    EXPECT_GT(max_rel_error(dv, dv0), 1e-2);
  }
}

TEST(OsftOps, ProjectionsMatchTheElementFormulas) {
  uint64_t seed = 200;
  for (auto [n, m, k] : kShapes) {
    const test_data::OsftFactors f(n, m, k, seed += 10);
    const int64_t r = f.r;
    // Left: coefficients over the rows, then the update with them.
    const std::vector<float> x0 = random_vector(n * r, seed + 7);
    std::vector<double> coeff(static_cast<size_t>(k * r)), want_c(coeff.size());
    cpu_ops().left_coefficients(coeff.data(), f.u_high.data(), x0.data(), n, k, r);
    for (int64_t l = 0; l < k; ++l)
      for (int64_t j = 0; j < r; ++j)
        want_c[static_cast<size_t>(l * r + j)] =
            kmath::osft_left_coefficient(f.u_high.data(), x0.data(), n, k, r, l, j);
    EXPECT_LE(max_rel_error(coeff, want_c), 1e-13) << n << "x" << m;
    std::vector<float> x = x0, want_x = x0;
    cpu_ops().project_left(x.data(), f.u_high.data(), coeff.data(), n, k, r);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < r; ++j) {
        float& e = want_x[static_cast<size_t>(i * r + j)];
        e = kmath::osft_project_left_element(e, f.u_high.data(), coeff.data(), k, r, i, j);
      }
    EXPECT_LE(max_rel_error(x, want_x), kFloatTol) << n << "x" << m;
    EXPECT_GT(max_rel_error(x, x0), 1e-2);

    // Right, in place over the rows of [r, m].
    const std::vector<float> y0 = random_vector(r * m, seed + 8);
    std::vector<float> y = y0, want_y = y0;
    cpu_ops().project_right(y.data(), f.v_high.data(), r, k, m);
    std::vector<double> t(static_cast<size_t>(k));
    for (int64_t i = 0; i < r; ++i) {
      float* row = want_y.data() + i * m;
      for (int64_t l = 0; l < k; ++l)
        t[static_cast<size_t>(l)] = kmath::osft_right_coefficient(row, f.v_high.data(), m, l);
      for (int64_t c = 0; c < m; ++c)
        row[c] = kmath::osft_project_right_element(row[c], t.data(), f.v_high.data(), k, m, c);
    }
    EXPECT_LE(max_rel_error(y, want_y), kFloatTol) << n << "x" << m;
    EXPECT_GT(max_rel_error(y, y0), 1e-2);
  }
}

// With orthonormal rows of V_high, the projected rows are orthogonal to them, and projecting
// again changes nothing beyond rounding.
TEST(OsftOps, RightProjectionRemovesTheFrozenRowSpace) {
  const int64_t k = 2, m = 3, rows = 4;
  const std::vector<float> v_high = {0.6f, 0.8f, 0.0f, 0.0f, 0.0f, 1.0f};
  std::vector<float> x = random_vector(rows * m, 7);
  cpu_ops().project_right(x.data(), v_high.data(), rows, k, m);
  for (int64_t i = 0; i < rows; ++i) {
    EXPECT_NEAR(x[i * m + 0] * 0.6 + x[i * m + 1] * 0.8, 0.0, 1e-6) << i;
    EXPECT_NEAR(x[i * m + 2], 0.0, 1e-6) << i;
  }
}

TEST(OsftOps, LeftCoefficientsOfAnEmptyShardAreZeroAndPartialsAddInOrder) {
  std::vector<double> coeff(6, 5.0);
  cpu_ops().left_coefficients(coeff.data(), nullptr, nullptr, 0, 2, 3);
  EXPECT_EQ(coeff, std::vector<double>(6, 0.0));
  // Three parts of two: 1e16 + 1 - 1e16 in part order is 0 in float64, as the formula says.
  const std::vector<double> partial = {1e16, 1.0, 1.0, 2.0, -1e16, 3.0};
  std::vector<double> total(2);
  cpu_ops().sum_partials(total.data(), partial.data(), 3, 2);
  EXPECT_EQ(total[0], (1e16 + 1.0) - 1e16);
  EXPECT_EQ(total[1], 6.0);
  EXPECT_EQ(total[0], kmath::osft_sum_partials_element(partial.data(), 3, 2, 0));
}

}  // namespace
}  // namespace optim
