// eigh_many / qr_many: a mixed list of sizes gives bit for bit what the same tasks give one per
// call (the optimizers' batched vs one-at-a-time refresh), and agrees with eigh()/qr() to
// rounding (those run threaded LAPACK on their one matrix, which rounds differently).
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
    FVec r(static_cast<size_t>(std::min(m, n) * n));
    be.qr(q1[i].data(), r.data(), a[i].data(), m, n, 1);
    double worst = 0;
    for (size_t j = 0; j < q1[i].size(); ++j)
      worst = std::max(worst, static_cast<double>(std::abs(q[i][j] - q1[i][j])));
    EXPECT_LE(worst, 1e-3) << "Q of task " << i << " against qr()";
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
