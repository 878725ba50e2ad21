// Test helpers for the CPU kernels: seeded random buffers, NaN-proof error measures
// (core/compare.h) and a central finite-difference check in float64.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/compare.h"
#include "core/rng.h"

namespace core::test {

// n normal values (mean 0, stddev `scale`) from a counter-based stream: the same on every run.
template <typename T = double>
std::vector<T> random_vec(int64_t n, uint64_t seed, double scale = 1.0) {
  std::vector<T> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[i] = static_cast<T>(scale * rng_normal(seed, i));
  return v;
}

inline std::vector<float> to_float(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}
inline std::vector<double> to_double(const std::vector<float>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// sum_i a_i w_i: the scalar loss whose gradient with respect to a is w.
inline double dot(const std::vector<double>& a, const std::vector<double>& w) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i)
    s += a[i] * w[i];
  return s;
}

// Prints the measured error of a check next to its tolerance and fails above it. NaN and
// infinity fail (core::within); the printed numbers are the ones the tolerances are set from.
inline void expect_within(const std::string& what, double err, double tol,
                          const std::string& detail = "") {
  std::printf("[ measured ] %s: %.3g (tolerance %.1g)\n", what.c_str(), err, tol);
  EXPECT_TRUE(core::within(err, tol)) << what << ": error " << err << " above " << tol << detail;
}

// ||a - b|| / ||b||, +infinity when a value on either side is not finite.
template <typename A, typename B>
double norm_rel_diff(const std::vector<A>& a, const std::vector<B>& b) {
  EXPECT_EQ(a.size(), b.size());
  return core::compare(a, b).norm_rel();
}

// max_i |a_i - b_i| / ulp_f32(b_i): float results against float64 references; +infinity when
// a value is not finite.
template <typename B>
double max_ulp_diff(const std::vector<float>& a, const std::vector<B>& b) {
  EXPECT_EQ(a.size(), b.size());
  return core::compare(a, b).max_ulp();
}

// Central differences in float64 with h = 1e-5 err by the truncation h^2 f'''/6 plus the
// rounding eps |loss| / h. Measured norm-relative over kernel_grad_test (each check prints its
// number): 2.0e-11 .. 6.6e-9 (the largest: cross-entropy with soft-cap on the round sizes).
constexpr double kGradTol = 2e-8;

// Compares `analytic` with the central difference (loss(x + h e_i) - loss(x - h e_i)) / 2h for
// every element of x (which `loss` reads), as ||analytic - fd|| / ||fd||; x is restored
// afterwards. A non-finite loss or gradient fails.
inline void expect_gradient(const std::string& name, std::vector<double>& x,
                            const std::function<double()>& loss,
                            const std::vector<double>& analytic, double tol = kGradTol,
                            double h = 1e-5) {
  ASSERT_EQ(x.size(), analytic.size()) << name;
  std::vector<double> fd(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    double saved = x[i];
    x[i] = saved + h;
    double lp = loss();
    x[i] = saved - h;
    double lm = loss();
    x[i] = saved;
    fd[i] = (lp - lm) / (2 * h);
  }
  const core::Difference d = core::compare(analytic, fd);
  expect_within(name + ": gradient vs finite differences, norm-relative", d.norm_rel(), tol,
                "; largest difference at element " + std::to_string(d.worst_index()));
}

// dst - base elementwise: what an accumulating backward added to a prefilled buffer.
inline std::vector<double> minus(const std::vector<double>& dst, const std::vector<double>& base) {
  std::vector<double> r(dst.size());
  for (size_t i = 0; i < dst.size(); ++i)
    r[i] = dst[i] - base[i];
  return r;
}

}  // namespace core::test
