// Test helpers for the CPU kernels: seeded random buffers and a central finite-difference check
// in float64.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/core/rng.h"

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

// Compares `analytic` with the central difference (loss(x + h e_i) - loss(x - h e_i)) / 2h for
// every element of x (which `loss` reads); x is restored afterwards.
inline void expect_gradient(const std::string& name, std::vector<double>& x,
                            const std::function<double()>& loss,
                            const std::vector<double>& analytic, double tol = 1e-6,
                            double h = 1e-5) {
  ASSERT_EQ(x.size(), analytic.size()) << name;
  double worst = 0.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double saved = x[i];
    x[i] = saved + h;
    double lp = loss();
    x[i] = saved - h;
    double lm = loss();
    x[i] = saved;
    double fd = (lp - lm) / (2 * h);
    double err = std::abs(fd - analytic[i]) / std::max(1.0, std::abs(fd));
    if (err > worst) {
      worst = err;
      worst_i = i;
    }
  }
  EXPECT_LE(worst, tol) << name << ": worst relative error at element " << worst_i;
}

// max_i |a_i - b_i| / max(1, |b_i|).
template <typename A, typename B>
double max_rel_diff(const std::vector<A>& a, const std::vector<B>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    double d = std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    worst = std::max(worst, d / std::max(1.0, std::abs(static_cast<double>(b[i]))));
  }
  return worst;
}

// dst - base elementwise: what an accumulating backward added to a prefilled buffer.
inline std::vector<double> minus(const std::vector<double>& dst, const std::vector<double>& base) {
  std::vector<double> r(dst.size());
  for (size_t i = 0; i < dst.size(); ++i)
    r[i] = dst[i] - base[i];
  return r;
}

}  // namespace core::test
