// Newton-Schulz orthogonalisation on the host, built from GEMMs and templated on the scalar type
// (the CPU Muon ops instantiate it for float, the tests also for double).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "core/cpu/cpu_gemm.h"
#include "core/cpu/cpu_linalg.h"
#include "optim/muon/muon_math.h"
#include "optim/muon/newton_schulz.h"

namespace optim::cpu {

using core::cpu::for_each_matrix;

// C = alpha A op(B) + beta C, row-major: in f32 the backend's GEMM (oneDNN, cpu_gemm.h), in
// float64 OpenBLAS's with the coefficients unrounded.
template <typename T>
void ns_gemm(bool trans_b, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda,
             const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    core::GemmArgs g;
    g.trans_b = trans_b, g.m = m, g.n = n, g.k = k, g.alpha = alpha, g.beta = beta;
    g.lda = lda, g.ldb = ldb, g.ldc = ldc;
    core::cpu::gemm(g, a, b, c);
  } else {
    core::cpu::blas_gemm(false, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

// The iterations on the wide X [rows, cols] in f32 (or T): X <- X / (norm_scale ||X||_F +
// norm_eps); per (a, b, c): X <- a X + (b A + c A A) X with A = X X^T.
template <typename T>
void newton_schulz_iterate(std::vector<T>& X, int64_t rows, int64_t cols,
                           const NewtonSchulzSchedule& schedule) {
  std::vector<T> Xn(X.size()), A(static_cast<size_t>(rows * rows)), Bm(A.size());
  double ss = 0.0;
  for (T e : X)
    ss += static_cast<double>(e) * static_cast<double>(e);
  T inv = T(1) / (T(schedule.norm_scale) * static_cast<T>(std::sqrt(ss)) + T(schedule.norm_eps));
  for (T& e : X)
    e *= inv;
  for (const auto& coef : schedule.coefficients) {
    T ca = coef[0], cb = coef[1], cc = coef[2];
    ns_gemm(true, rows, rows, cols, T(1), X.data(), cols, X.data(), cols, T(0), A.data(), rows);
    Bm = A;
    ns_gemm(false, rows, rows, rows, cc, A.data(), rows, A.data(), rows, cb, Bm.data(), rows);
    Xn = X;
    ns_gemm(false, rows, cols, rows, T(1), Bm.data(), rows, X.data(), cols, ca, Xn.data(), cols);
    X.swap(Xn);
  }
}

// The same in bfloat16 op by op (NewtonSchulzSchedule::bf16; float only), as the record's
// zeropower_via_newtonschulz5 runs on G.bfloat16(): X = r(r(X) / r(r(||r(X)||_F) + eps)) with r
// the rounding to bf16 (kmath::ns_round), then per (a, b, c): A = r(X X^T), B = r(r(b A) +
// r(r(c A) A)) (its `c * A @ A` is (c A) A), X = r(r(a X) + r(B X)) as eager PyTorch rounds
// (schedule.bf16_eager), B = r(b A + r(r(c A) A)), X = r(a X + r(B X)) as the record's compiled
// function does (the default). The GEMMs' products of bf16 values are exact; their sums are f32.
inline void newton_schulz_iterate_bf16(std::vector<float>& X, int64_t rows, int64_t cols,
                                       const NewtonSchulzSchedule& schedule) {
  using kmath::ns_round;
  const auto axpy = schedule.bf16_eager ? kmath::ns_bf16_axpy : kmath::ns_bf16_fused_axpy;
  std::vector<float> P(X.size()), A(static_cast<size_t>(rows * rows)), cA(A.size()), Bm(A.size());
  double ss = 0.0;
  for (float& e : X) {
    e = ns_round(e);
    ss += static_cast<double>(e) * static_cast<double>(e);
  }
  float norm = ns_round(static_cast<float>(std::sqrt(ss)));
  if (schedule.norm_scale != 1.0f) norm = ns_round(schedule.norm_scale * norm);
  const float denom = ns_round(norm + schedule.norm_eps);
  for (float& e : X)
    e = ns_round(e / denom);
  for (const auto& [ca, cb, cc] : schedule.coefficients) {
    ns_gemm(true, rows, rows, cols, 1.0f, X.data(), cols, X.data(), cols, 0.0f, A.data(), rows);
    for (size_t i = 0; i < A.size(); ++i) {
      A[i] = ns_round(A[i]);
      cA[i] = kmath::ns_bf16_scale(cc, A[i]);
    }
    ns_gemm(false, rows, rows, rows, 1.0f, cA.data(), rows, A.data(), rows, 0.0f, Bm.data(), rows);
    for (size_t i = 0; i < A.size(); ++i)
      Bm[i] = axpy(cb, A[i], Bm[i]);
    ns_gemm(false, rows, cols, rows, 1.0f, Bm.data(), rows, X.data(), cols, 0.0f, P.data(), cols);
    for (size_t i = 0; i < X.size(); ++i)
      X[i] = axpy(ca, X[i], P[i]);
  }
}

// One matrix x [m, n] in place, iterated on its wide orientation X [r, c] (r <= c), so the Gram
// matrix A = X X^T is the small r x r one.
template <typename T>
void newton_schulz_one(T* x, int64_t m, int64_t n, const NewtonSchulzSchedule& schedule) {
  bool tall = m > n;
  int64_t rows = tall ? n : m, cols = tall ? m : n;
  std::vector<T> X(static_cast<size_t>(rows * cols));
  if (tall) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j)
        X[j * cols + i] = x[i * n + j];
    }
  } else {
    std::copy_n(x, m * n, X.data());
  }
  if constexpr (std::is_same_v<T, float>) {
    if (schedule.bf16) {
      newton_schulz_iterate_bf16(X, rows, cols, schedule);
    } else {
      newton_schulz_iterate(X, rows, cols, schedule);
    }
  } else {
    ENGINE_CHECK(!schedule.bf16, "newton_schulz: the bf16 iteration is defined on float");
    newton_schulz_iterate(X, rows, cols, schedule);
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
