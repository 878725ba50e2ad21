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

namespace {

using core::test::random_vec;
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

// With a left factor the task is the QR of the product (one step of orthogonal iteration), in
// place: the same Q as the product formed first, to rounding, and bit for bit batched or not.
TEST(LinalgMany, QrManyOfAProductInPlace) {
  core::Backend& be = core::cpu_backend();
  const std::vector<int64_t> sizes = {128, 40, 128, 1};
  std::vector<FVec> k, q, q1;
  std::vector<core::QrTask> tasks;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    k.push_back(random_spd(n, 300 + i));
    q.push_back(random_vec<float>(n * n, 310 + i));
    q1.push_back(q.back());
  }
  for (size_t i = 0; i < sizes.size(); ++i)
    tasks.push_back({q[i].data(), q[i].data(), sizes[i], sizes[i], k[i].data()});
  be.qr_many(tasks);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    FVec product(static_cast<size_t>(n * n)), q2(static_cast<size_t>(n * n));
    core::GemmArgs args;
    args.m = args.n = args.k = n;
    be.gemm(args, k[i].data(), q1[i].data(), product.data());
    const core::QrTask of_product{product.data(), q2.data(), n, n};
    be.qr_many({&of_product, 1});
    core::test::expect_within("QR of K Q in the task vs of the product formed first (n " +
                                  std::to_string(n) + "), norm-relative",
                              core::test::norm_rel_diff(q[i], q2), 1e-6);  // measured 0
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
