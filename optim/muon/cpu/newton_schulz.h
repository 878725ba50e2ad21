// Newton-Schulz orthogonalisation on the host, built from BLAS GEMM and templated on the scalar
// type (the CPU Muon ops instantiate it for float, the tests also for double).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/cpu/cpu_gemm.h"
#include "core/cpu/cpu_linalg.h"
#include "optim/muon/newton_schulz.h"

namespace optim::cpu {

using core::cpu::blas_gemm;
using core::cpu::for_each_matrix;

// One matrix x [m, n] in place. Works on the wide orientation X [r, c] (r <= c), so the Gram
// matrix A = X X^T is the small r x r one:
//   X <- X / (norm_scale ||X||_F + norm_eps); per (a, b, c): X <- a X + (b A + c A A) X.
template <typename T>
void newton_schulz_one(T* x, int64_t m, int64_t n, const NewtonSchulzSchedule& schedule) {
  bool tall = m > n;
  int64_t rows = tall ? n : m, cols = tall ? m : n;
  std::vector<T> X(static_cast<size_t>(rows * cols)), Xn(X.size());
  std::vector<T> A(static_cast<size_t>(rows * rows)), Bm(A.size());
  if (tall) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j)
        X[j * cols + i] = x[i * n + j];
    }
  } else {
    std::copy_n(x, m * n, X.data());
  }
  double ss = 0.0;
  for (T e : X)
    ss += static_cast<double>(e) * static_cast<double>(e);
  T inv = T(1) / (T(schedule.norm_scale) * static_cast<T>(std::sqrt(ss)) + T(schedule.norm_eps));
  for (T& e : X)
    e *= inv;
  for (const auto& coef : schedule.coefficients) {
    T ca = coef[0], cb = coef[1], cc = coef[2];
    blas_gemm(false, true, rows, rows, cols, T(1), X.data(), cols, X.data(), cols, T(0), A.data(),
              rows);
    Bm = A;
    blas_gemm(false, false, rows, rows, rows, cc, A.data(), rows, A.data(), rows, cb, Bm.data(),
              rows);
    Xn = X;
    blas_gemm(false, false, rows, cols, rows, T(1), Bm.data(), rows, X.data(), cols, ca, Xn.data(),
              cols);
    X.swap(Xn);
  }
  if (tall) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j)
        x[i * n + j] = X[j * cols + i];
    }
  } else {
    std::copy_n(X.data(), m * n, x);
  }
}

template <typename T>
void newton_schulz(T* x, int64_t m, int64_t n, const NewtonSchulzSchedule& schedule,
                   int64_t batch) {
  if (m == 0 || n == 0) return;
  for_each_matrix(batch, [&](int64_t i) { newton_schulz_one(x + i * m * n, m, n, schedule); });
}

}  // namespace optim::cpu
