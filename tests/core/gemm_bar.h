// The bar two GEMMs of the same exact products are held to (bf16 x bf16 is exact in f32): each
// adds the products, alpha and beta C in its own order, so each is within
// gamma_(k+2) (|alpha| sum_l |a_il b_lj| + |beta c_ij|) of the exact value, gamma_n = n u /
// (1 - n u) for a format of unit roundoff u (Higham, any summation order). Used by the bf16 GEMM
// tests of both backends.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/ops/gemm.h"

namespace core::test {

inline double gamma_bound(int64_t n, double u) {
  return static_cast<double>(n) * u / (1 - static_cast<double>(n) * u);
}

// The largest |got - want| over rel (|alpha| sum |a b| + |beta c0|) across C (<= 1 passes; a NaN
// sticks): `value` gives an element of A or B as the GEMM multiplies it, `rel` is the relative
// bar (the sum of both results' gammas, and any rounding of the inputs).
template <typename T>
double worst_over_gemm_bar(const GemmArgs& g, const std::vector<T>& a, const std::vector<T>& b,
                           const std::vector<float>& c0, const std::vector<float>& got,
                           const std::vector<float>& want, float (*value)(T), double rel) {
  double worst = 0;
  for (int64_t p = 0; p < g.batch; ++p) {
    for (int64_t i = 0; i < g.m; ++i) {
      for (int64_t j = 0; j < g.n; ++j) {
        double mass = 0;
        for (int64_t l = 0; l < g.k; ++l) {
          const float av = value(a[p * g.stride_a + (g.trans_a ? l * g.lda + i : i * g.lda + l)]);
          const float bv = value(b[p * g.stride_b + (g.trans_b ? j * g.ldb + l : l * g.ldb + j)]);
          mass += std::fabs(static_cast<double>(av) * bv);
        }
        const int64_t at = p * g.stride_c + i * g.ldc + j;
        const double bar = rel * (std::fabs(g.alpha) * mass + std::fabs(g.beta * c0[at])) + 1e-300;
        const double d = std::fabs(static_cast<double>(got[at]) - want[at]) / bar;
        if (!(d <= worst)) worst = d;
      }
    }
  }
  return worst;
}

}  // namespace core::test
