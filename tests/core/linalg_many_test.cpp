// eigh_many / qr_many / gram_many: a mixed list of sizes gives bit for bit what the same tasks
// give one per call (the optimizers' batched vs one-at-a-time refresh), and agrees with eigh()/qr()
// to rounding (those run threaded LAPACK on their one matrix, which rounds differently; qr_many's Q
// is CholeskyQR2's where it can be, with R's diagonal non-negative, so up to column signs too).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/check.h"
#include "grad_check.h"
#include "tests/linalg_reference.h"

namespace {

using core::test::random_vec;
using test_linalg::orthonormal_columns;
using test_linalg::product;
using FVec = std::vector<float>;

// A symmetric positive semi-definite [n, n] matrix G G^T from a random G [n, n + 3].
FVec random_spd(int64_t n, uint64_t seed) {
  const int64_t k = n + 3;
  const FVec g = random_vec<float>(n * k, seed);
  FVec a(static_cast<size_t>(n * n), 0.0f);
  core::GemmArgs args;
  args.trans_b = true;
  args.m = n;
  args.n = n;
  args.k = k;
  core::cpu_backend().gemm(args, g.data(), g.data(), a.data());
  return a;
}

bool same_bits(const FVec& a, const FVec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

const std::vector<int64_t> kSizes = {384, 128, 128, 512, 33, 128, 1, 64};

TEST(LinalgMany, EighManyEqualsEighBitForBit) {
  core::Backend& be = core::cpu_backend();
  std::vector<FVec> a, w, v, w1, v1;
  for (size_t i = 0; i < kSizes.size(); ++i) {
    const int64_t n = kSizes[i];
    a.push_back(random_spd(n, 100 + i));
    w.emplace_back(n);
    v.emplace_back(n * n);
    w1.emplace_back(n);
    v1.emplace_back(n * n);
  }
  std::vector<core::EighTask> tasks;
  for (size_t i = 0; i < kSizes.size(); ++i)
    tasks.push_back({a[i].data(), w[i].data(), v[i].data(), kSizes[i]});
  be.eigh_many(tasks);
  for (size_t i = 0; i < kSizes.size(); ++i) {
    const core::EighTask one{a[i].data(), w1[i].data(), v1[i].data(), kSizes[i]};
    be.eigh_many({&one, 1});
    EXPECT_TRUE(same_bits(w[i], w1[i]))
        << "eigenvalues of task " << i << " (n " << kSizes[i] << ")";
    EXPECT_TRUE(same_bits(v[i], v1[i]))
        << "eigenvectors of task " << i << " (n " << kSizes[i] << ")";
    // Against the threaded single-matrix eigh: the same eigenvalues to rounding.
    be.eigh(w1[i].data(), v1[i].data(), a[i].data(), kSizes[i], 1);
    double worst = 0, scale = 0;
    for (int64_t j = 0; j < kSizes[i]; ++j) {
      worst = std::max(worst, static_cast<double>(std::abs(w[i][j] - w1[i][j])));
      scale = std::max(scale, static_cast<double>(std::abs(w1[i][j])));
    }
    EXPECT_LE(worst, 1e-4 * scale + 1e-6) << "eigenvalues of task " << i;
  }
  be.eigh_many({});  // an empty list is a no-op
}

TEST(LinalgMany, QrManyEqualsQrBitForBit) {
  core::Backend& be = core::cpu_backend();
  const std::vector<std::array<int64_t, 2>> shapes = {{384, 384}, {128, 128}, {512, 512}, {40, 24},
                                                      {24, 40},   {128, 128}, {1, 1}};
  std::vector<FVec> a, q, q1;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto [m, n] = shapes[i];
    a.push_back(random_vec<float>(m * n, 200 + i));
    q.emplace_back(m * std::min(m, n));
    q1.emplace_back(m * std::min(m, n));
  }
  std::vector<core::QrTask> tasks;
  for (size_t i = 0; i < shapes.size(); ++i)
    tasks.push_back({a[i].data(), q[i].data(), shapes[i][0], shapes[i][1]});
  be.qr_many(tasks);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto [m, n] = shapes[i];
    const core::QrTask one{a[i].data(), q1[i].data(), m, n};
    be.qr_many({&one, 1});
    EXPECT_TRUE(same_bits(q[i], q1[i])) << "Q of task " << i << " [" << m << ", " << n << "]";
    // Against the Householder qr(): the same Q up to rounding and column signs, and qr_many's
    // columns signed so that R = Q^T A has a non-negative diagonal.
    const int64_t r = std::min(m, n);
    FVec rr(static_cast<size_t>(r * n));
    be.qr(q1[i].data(), rr.data(), a[i].data(), m, n, 1);
    double worst = 0;
    for (int64_t col = 0; col < r; ++col) {
      const float sign = rr[col * n + col] < 0 ? -1.0f : 1.0f;
      double r_diag = 0;
      for (int64_t row = 0; row < m; ++row) {
        const float x = q[i][row * r + col];
        worst = std::max(worst, static_cast<double>(std::abs(x - sign * q1[i][row * r + col])));
        r_diag += static_cast<double>(x) * a[i][row * n + col];
      }
      EXPECT_GE(r_diag, 0.0) << "R's diagonal, task " << i << " column " << col;
    }
    EXPECT_LE(worst, 1e-3) << "Q of task " << i << " against qr(), up to column signs";
  }
}

// With a left factor the task is the QR of the product K Q (one step of orthogonal iteration),
// in place. Its bar follows from the arithmetic, not from two GEMM paths rounding alike (they do
// not: another BLAS kernel or thread split sums in another order). K = U diag(lambda) U^T has a
// known spectrum in [1, kappa] and Q is orthonormal, so A = K Q has singular values lambda and
// ||A^+||_2 = 1. To first order the computed Q differs from the exact one by at most
// sqrt(2) ||A^+||_2 ||dA||_F (Sun 1991), dA the backward error of forming the product and of the
// QR: the GEMM's is at most gamma_n |K| |Q| elementwise (gamma_n = n u / (1 - n u), any summation
// order, u = 2^-24), and a backward-stable QR's (CholeskyQR2 at this conditioning, or the
// Householder fallback) gamma_n ||A||_F per column, taken as gamma_n ||A||_F in all. Against
// the QR of the product computed in float64 the bar is that bound, norm-relative (||Q||_F =
// sqrt(n)); a wrong factor or a stale Q lands orders of magnitude above it (checked below).
TEST(LinalgMany, QrManyOfAProductInPlace) {
  core::Backend& be = core::cpu_backend();
  const std::vector<int64_t> sizes = {128, 40, 128, 1};
  const double kappa = 8.0, u = std::ldexp(1.0, -24);
  std::vector<FVec> k, q, q1;
  std::vector<core::QrTask> tasks;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    const std::vector<double> basis = orthonormal_columns(random_vec<double>(n * n, 300 + i), n);
    std::vector<double> scaled(basis);  // U diag(lambda), lambda log-spaced over [1, kappa]
    for (int64_t c = 0; c < n; ++c) {
      const double lambda = std::pow(kappa, n > 1 ? double(c) / double(n - 1) : 0.0);
      for (int64_t r = 0; r < n; ++r)
        scaled[r * n + c] *= lambda;
    }
    std::vector<double> kd(static_cast<size_t>(n * n), 0.0);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < n; ++c)
        for (int64_t l = 0; l < n; ++l)
          kd[r * n + c] += scaled[r * n + l] * basis[c * n + l];
    k.push_back(core::test::to_float(kd));
    q.push_back(core::test::to_float(orthonormal_columns(random_vec<double>(n * n, 310 + i), n)));
    q1.push_back(q.back());
  }
  for (size_t i = 0; i < sizes.size(); ++i)
    tasks.push_back({q[i].data(), q[i].data(), sizes[i], sizes[i], k[i].data()});
  be.qr_many(tasks);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    const std::vector<double> kd = core::test::to_double(k[i]), qd = core::test::to_double(q1[i]);
    const std::vector<double> want = orthonormal_columns(product(kd, qd, n), n);
    // The bar: sqrt(2) (gamma_n || |K| |Q| ||_F + gamma_n ||K Q||_F) / sqrt(n), ||A^+||_2 = 1
    // (the float rounding of K and Q moves the singular values by about u, left out).
    std::vector<double> abs_k(kd), abs_q(qd);
    for (double& x : abs_k)
      x = std::abs(x);
    for (double& x : abs_q)
      x = std::abs(x);
    const double gamma = double(n) * u / (1.0 - double(n) * u);
    const auto frobenius = [](const std::vector<double>& m) {
      double s = 0;
      for (const double x : m)
        s += x * x;
      return std::sqrt(s);
    };
    const double bar = std::sqrt(2.0) * gamma *
                       (frobenius(product(abs_k, abs_q, n)) + frobenius(product(kd, qd, n))) /
                       std::sqrt(double(n));
    const std::string size = " (n " + std::to_string(n) + "), norm-relative";
    core::test::expect_within("QR of K Q in the task vs float64" + size,
                              core::test::norm_rel_diff(q[i], want), bar);
    // The same for the product formed first and handed to qr_many without a left factor.
    FVec formed(static_cast<size_t>(n * n)), q2(static_cast<size_t>(n * n));
    core::GemmArgs args;
    args.m = args.n = args.k = n;
    be.gemm(args, k[i].data(), q1[i].data(), formed.data());
    const core::QrTask of_product{formed.data(), q2.data(), n, n};
    be.qr_many({&of_product, 1});
    core::test::expect_within("QR of the product formed first vs float64" + size,
                              core::test::norm_rel_diff(q2, want), bar);
    // The bar tells a wrong product: the stale Q (no product) and the other task's factor of
    // the same size each land far above it.
    if (n > 1) {
      const double stale = core::test::norm_rel_diff(q1[i], want);
      EXPECT_GT(stale, 100 * bar) << "a stale Q would pass, n " << n;
      const size_t other = i == 0 ? 2 : 0;
      if (sizes[other] == n && other != i) {
        const double wrong_factor = core::test::norm_rel_diff(
            orthonormal_columns(product(core::test::to_double(k[other]), qd, n), n), want);
        EXPECT_GT(wrong_factor, 100 * bar) << "another factor's product would pass, n " << n;
      }
    }
    const core::QrTask one{q1[i].data(), q1[i].data(), n, n, k[i].data()};
    be.qr_many({&one, 1});
    EXPECT_TRUE(same_bits(q[i], q1[i])) << "batched vs one at a time, task " << i;
  }
}

// gram_many: a^T a and a a^T against float64 sums, exactly symmetric, and bit for bit batched or
// one task per call.
TEST(LinalgMany, GramManyIsTheSymmetricProduct) {
  core::Backend& be = core::cpu_backend();
  struct Shape {
    int64_t rows, cols;
    bool outer;
  };
  const std::vector<Shape> shapes = {{384, 128, true}, {384, 128, false}, {33, 70, false},
                                     {70, 33, true},   {5, 0, true},      {0, 4, false}};
  std::vector<FVec> a, out, out1;
  std::vector<core::GramTask> tasks;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& sh = shapes[i];
    const int64_t k = sh.outer ? sh.rows : sh.cols;
    a.push_back(random_vec<float>(sh.rows * sh.cols, 400 + i));
    out.emplace_back(k * k, std::nanf(""));
    out1.emplace_back(k * k, std::nanf(""));
  }
  for (size_t i = 0; i < shapes.size(); ++i)
    tasks.push_back({a[i].data(), out[i].data(), shapes[i].rows, shapes[i].cols, shapes[i].outer});
  be.gram_many(tasks);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& sh = shapes[i];
    const int64_t k = sh.outer ? sh.rows : sh.cols, inner = sh.outer ? sh.cols : sh.rows;
    std::vector<double> want(static_cast<size_t>(k * k), 0.0);
    for (int64_t r = 0; r < k; ++r)
      for (int64_t c = 0; c < k; ++c)
        for (int64_t l = 0; l < inner; ++l)
          want[r * k + c] += sh.outer ? double(a[i][r * sh.cols + l]) * a[i][c * sh.cols + l]
                                      : double(a[i][l * sh.cols + r]) * a[i][l * sh.cols + c];
    // measured 1.0e-7 .. 1.9e-7
    core::test::expect_within("gram task " + std::to_string(i) + " vs float64, norm-relative",
                              core::test::norm_rel_diff(out[i], want), 5e-7);
    for (int64_t r = 0; r < k; ++r)
      for (int64_t c = 0; c < r; ++c)
        ASSERT_EQ(out[i][r * k + c], out[i][c * k + r]) << "symmetry, task " << i;
    const core::GramTask one{a[i].data(), out1[i].data(), sh.rows, sh.cols, sh.outer};
    be.gram_many({&one, 1});
    EXPECT_TRUE(same_bits(out[i], out1[i])) << "batched vs one at a time, task " << i;
  }
}

TEST(LinalgMany, ErrorsNameTheTask) {
  FVec a = {1.0f, 0.0f, 0.0f, std::numeric_limits<float>::quiet_NaN()};
  FVec w(2), v(4);
  const core::EighTask task{a.data(), w.data(), v.data(), 2};
  try {
    core::cpu_backend().eigh_many({&task, 1});
    FAIL() << "a NaN input was accepted";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("eigh of batch member 0"), std::string::npos) << e.what();
  }
}

}  // namespace
