// float64 references for the linear-algebra tests (qr_many, the SOAP refresh): plain loops whose
// rounding is far below the float results they check.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace test_linalg {

// The Q factor of a [n, n] with R's diagonal positive (as qr_many signs it): modified
// Gram-Schmidt with each column orthogonalised twice, orthonormal to rounding for any
// well-conditioned a.
inline std::vector<double> orthonormal_columns(std::vector<double> a, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t p = 0; p < j; ++p) {
        double dot = 0;
        for (int64_t i = 0; i < n; ++i)
          dot += a[i * n + p] * a[i * n + j];
        for (int64_t i = 0; i < n; ++i)
          a[i * n + j] -= dot * a[i * n + p];
      }
    double norm = 0;
    for (int64_t i = 0; i < n; ++i)
      norm += a[i * n + j] * a[i * n + j];
    norm = std::sqrt(norm);
    for (int64_t i = 0; i < n; ++i)
      a[i * n + j] /= norm;
  }
  return a;
}

// c [n, n] = a b.
inline std::vector<double> product(const std::vector<double>& a, const std::vector<double>& b,
                                   int64_t n) {
  std::vector<double> c(static_cast<size_t>(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t p = 0; p < n; ++p)
      for (int64_t j = 0; j < n; ++j)
        c[i * n + j] += a[i * n + p] * b[p * n + j];
  return c;
}

}  // namespace test_linalg
