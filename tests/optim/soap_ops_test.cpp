// The SOAP family's element math (soap_math.h) against float64 formulas, and its CPU ops against
// direct loops over that math. The CUDA ops run the same functions (CudaVsCpu.Soap* compare them).
// The amortized pre-sort refresh against the same steps in float64.
#include "optim/soap/soap_ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "optim/soap/eigenbasis.h"
#include "tests/backend_test_data.h"
#include "tests/linalg_reference.h"

namespace optim {
namespace {

using test_data::random_vector;

TEST(SoapMath, KlInverseWeightClampsAtEps) {
  EXPECT_EQ(kmath::kl_inverse_weight(2.0f, 1e-3, 4), static_cast<float>(1.0 / 4 / 2.0));
  EXPECT_EQ(kmath::kl_inverse_weight(-1.0f, 1e-3, 4), static_cast<float>(1.0 / 4 / 1e-3));
  EXPECT_EQ(kmath::kl_inverse_weight(0.0f, 1e-3, 4), static_cast<float>(1.0 / 4 / 1e-3));
  EXPECT_TRUE(std::isnan(kmath::kl_inverse_weight(std::nanf(""), 1e-3, 4)));  // as std::max
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

TEST(SoapCpuOps, AdamIsTheKernelMath) {
  const std::unique_ptr<SoapOps> ops = make_soap_ops(core::cpu_backend());
  const int64_t n = 40000;  // above the parallel threshold
  auto m = random_vector(n, 8, 0.1f), v = random_vector(n, 9, 0.1f), g = random_vector(n, 10);
  for (float& e : v)
    e *= e;
  for (bool raw : {true, false}) {
    kmath::SoapAdamStep s;
    s.raw = raw;
    s.c1 = 0.5f, s.c2 = 0.25f;
    std::vector<float> mm = m, vv = v, d(n);
    ops->adam(d.data(), mm.data(), vv.data(), g.data(), n, s);
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

TEST(SoapCpuOps, ClipScalesBySumOfSquaresInIndexOrder) {
  const std::unique_ptr<SoapOps> ops = make_soap_ops(core::cpu_backend());
  const int64_t n = 50000;
  auto x = random_vector(n, 11);
  double want = 0;
  for (float e : x)
    want += static_cast<double>(e) * e;
  std::vector<float> d = x;
  ops->clip_update_rms(d.data(), n, 0.5);
  const float s = kmath::soap_rms_clip_scale(want, n, 0.5);
  EXPECT_LT(s, 1.0f);
  for (int64_t i = 0; i < n; i += 101)
    EXPECT_EQ(d[i], x[i] * s);
}

TEST(SoapCpuOps, KlRootWeightColumnsScaleTheBasis) {
  const std::unique_ptr<SoapOps> ops = make_soap_ops(core::cpu_backend());
  const int64_t n = 6;
  auto q = random_vector(n * n, 12), lam = random_vector(n, 13);
  std::vector<float> out(n * n);
  ops->kl_root_weight_columns(out.data(), q.data(), lam.data(), n, 1e-3);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j)
      EXPECT_EQ(out[i * n + j], q[i * n + j] * kmath::kl_inverse_root_weight(lam[j], 1e-3, n));
}

// The root weights square to the weights: (B B^T = C) up to float rounding.
TEST(SoapMath, KlRootWeightSquaresToTheWeight) {
  for (const float lam : {0.0f, 1e-6f, 0.37f, 12.5f, 3e4f}) {
    const float r = kmath::kl_inverse_root_weight(lam, 1e-3, 24);
    const float w = kmath::kl_inverse_weight(lam, 1e-3, 24);
    EXPECT_NEAR(static_cast<double>(r) * r, w, 3e-7 * w) << lam;  // three float roundings
  }
}

using test_linalg::orthonormal_columns;
using test_linalg::product;

// qr_sort before (the amortized reference): the old basis sorted by its Rayleigh quotients with
// the new factor, then power_iter_steps rounds of Q <- qr(K Q).Q from it, V's permutation
// returned. The refresh forms K Q once and factors its sorted columns in the first round; this is
// the reference's order of steps, each in float64.
TEST(SoapRefresh, PresortSortsTheOldBasisThenIteratesFromIt) {
  const int64_t n = 24, k = 30;
  // K = A A^T / k (symmetric positive definite); the old basis an orthonormal Q0.
  const std::vector<float> a = test_data::random_vector(n * k, 21);
  std::vector<float> kf(static_cast<size_t>(n * n));
  std::vector<double> kd(kf.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < k; ++p)
        sum += static_cast<double>(a[i * k + p]) * a[j * k + p];
      kf[i * n + j] = static_cast<float>(sum / k);
    }
  for (size_t i = 0; i < kf.size(); ++i)
    kd[i] = kf[i];
  const std::vector<float> r = test_data::random_vector(n * n, 22);
  const std::vector<double> q0 = orthonormal_columns(std::vector<double>(r.begin(), r.end()), n);

  for (const int steps : {1, 2}) {
    // float64: Rayleigh quotients, their descending order, the sorted basis, the power rounds.
    std::vector<double> lam(static_cast<size_t>(n), 0.0);
    const std::vector<double> kq0 = product(kd, q0, n);
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < n; ++i)
        lam[j] += q0[i * n + j] * kq0[i * n + j];
    std::vector<int32_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t x, int32_t y) { return lam[x] > lam[y]; });
    std::vector<double> q(q0.size());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j)
        q[i * n + j] = q0[i * n + order[j]];
    for (int round = 0; round < steps; ++round)
      q = orthonormal_columns(product(kd, q, n), n);

    std::vector<float> qf(q0.begin(), q0.end()), lamf(static_cast<size_t>(n));
    BackendIndices got_order(core::cpu_backend(), n);
    FactorRefresh job{kf.data(), qf.data(), lamf.data(), n, false, false, got_order.get()};
    refresh_factor(core::cpu_backend(), job, steps, nullptr);

    for (int64_t j = 0; j < n; ++j) {
      ASSERT_EQ(got_order.get()[j], order[j]) << "steps " << steps << ", column " << j;
      EXPECT_NEAR(lamf[j], lam[order[j]], 1e-5 * std::abs(lam[order[j]])) << j;
    }
    double worst = 0;
    for (size_t i = 0; i < q.size(); ++i)
      worst = std::max(worst, std::abs(qf[i] - q[i]));
    EXPECT_LT(worst, 2e-5) << "steps " << steps;

    // The batched form (the CUDA ops' refresh, here through the CPU backend) agrees.
    std::vector<float> qb(q0.begin(), q0.end()), lamb(static_cast<size_t>(n));
    BackendIndices batched_order(core::cpu_backend(), n);
    FactorRefresh batched{kf.data(), qb.data(), lamb.data(), n, false, false, batched_order.get()};
    refresh_factors_batched(core::cpu_backend(), {&batched, 1}, steps, nullptr);
    for (int64_t j = 0; j < n; ++j)
      EXPECT_EQ(batched_order.get()[j], order[j]) << j;
    for (size_t i = 0; i < q.size(); ++i)
      EXPECT_NEAR(qb[i], qf[i], 2e-5) << i;
  }
}

}  // namespace
}  // namespace optim
