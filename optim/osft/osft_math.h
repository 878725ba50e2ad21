// OSFT's element math (docs/specs/osft.md): one output element of each product of osft_ops.h. A
// target W [n, m] is held as U_high diag(S_high) V_high + U_low diag(S_low) V_low with
// U_* [n, k|r], S_* [k|r] and V_* [k|r, m], all row-major. Every sum runs in float64 over float
// inputs and is rounded once. The CUDA ops evaluate these; the CPU ops form the same float64
// products with Eigen's GEMM (so their results stay those of the host code before there were
// device ops) and the CPU tests check these formulas against them.
#pragma once

#include <cstdint>

#include "core/kernel_math.h"

namespace optim::kmath {

// W[i, j] = sum_l (U_high[i, l] S_high[l]) V_high[l, j] + sum_l (U_low[i, l] S_low[l]) V_low[l, j].
ENGINE_HD inline float osft_dense_element(const float* u_high, const float* s_high,
                                          const float* v_high, const float* u_low,
                                          const float* s_low, const float* v_low, int64_t m,
                                          int64_t k, int64_t r, int64_t i, int64_t j) {
  double high = 0, low = 0;
  for (int64_t l = 0; l < k; ++l)
    high += (static_cast<double>(u_high[i * k + l]) * s_high[l]) * v_high[l * m + j];
  for (int64_t l = 0; l < r; ++l)
    low += (static_cast<double>(u_low[i * r + l]) * s_low[l]) * v_low[l * m + j];
  return static_cast<float>(high + low);
}

// (dW V_low^T)[i, j] = sum_c dW[i, c] V_low[j, c], the product both U_low's and S_low's chain
// rule read.
ENGINE_HD inline double osft_dw_v(const float* dw, const float* v_low, int64_t m, int64_t i,
                                  int64_t j) {
  double sum = 0;
  for (int64_t c = 0; c < m; ++c)
    sum += static_cast<double>(dw[i * m + c]) * v_low[j * m + c];
  return sum;
}

// dU_low[i, j] = (dW V_low^T)[i, j] S_low[j].
ENGINE_HD inline float osft_grad_u_element(const float* dw, const float* v_low, const float* s_low,
                                           int64_t m, int64_t i, int64_t j) {
  return static_cast<float>(osft_dw_v(dw, v_low, m, i, j) * s_low[j]);
}

// dS_low[j] = sum_i U_low[i, j] (dW V_low^T)[i, j] (u_j^T dW v_j): term i, and the sum of the
// terms in row order (the CUDA kernel sums the terms of one j in a fixed block order instead).
ENGINE_HD inline double osft_grad_s_term(const float* dw, const float* u_low, const float* v_low,
                                         int64_t m, int64_t r, int64_t i, int64_t j) {
  return static_cast<double>(u_low[i * r + j]) * osft_dw_v(dw, v_low, m, i, j);
}
ENGINE_HD inline float osft_grad_s_element(const float* dw, const float* u_low, const float* v_low,
                                           int64_t n, int64_t m, int64_t r, int64_t j) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i)
    sum += osft_grad_s_term(dw, u_low, v_low, m, r, i, j);
  return static_cast<float>(sum);
}

// dV_low[j, c] = S_low[j] sum_i U_low[i, j] dW[i, c].
ENGINE_HD inline float osft_grad_v_element(const float* dw, const float* u_low, const float* s_low,
                                           int64_t n, int64_t m, int64_t r, int64_t j, int64_t c) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i)
    sum += static_cast<double>(u_low[i * r + j]) * dw[i * m + c];
  return static_cast<float>(static_cast<double>(s_low[j]) * sum);
}

// Left coefficients (U_high^T X)[l, j] = sum_i U_high[i, l] X[i, j] over n rows, X [n, r].
ENGINE_HD inline double osft_left_coefficient(const float* u_high, const float* x, int64_t n,
                                              int64_t k, int64_t r, int64_t l, int64_t j) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i)
    sum += static_cast<double>(u_high[i * k + l]) * x[i * r + j];
  return sum;
}

// X[i, j] - (U_high coeff)[i, j] with the summed coefficients coeff [k, r].
ENGINE_HD inline float osft_project_left_element(float x, const float* u_high, const double* coeff,
                                                 int64_t k, int64_t r, int64_t i, int64_t j) {
  double sum = 0;
  for (int64_t l = 0; l < k; ++l)
    sum += static_cast<double>(u_high[i * k + l]) * coeff[l * r + j];
  return static_cast<float>(static_cast<double>(x) - sum);
}

// Right coefficient (x V_high^T)[l] = sum_c x[c] V_high[l, c] of one row x [m].
ENGINE_HD inline double osft_right_coefficient(const float* x, const float* v_high, int64_t m,
                                               int64_t l) {
  double sum = 0;
  for (int64_t c = 0; c < m; ++c)
    sum += static_cast<double>(x[c]) * v_high[l * m + c];
  return sum;
}

// x[c] - sum_l t[l] V_high[l, c] with the row's right coefficients t [k].
ENGINE_HD inline float osft_project_right_element(float x, const double* t, const float* v_high,
                                                  int64_t k, int64_t m, int64_t c) {
  double sum = 0;
  for (int64_t l = 0; l < k; ++l)
    sum += t[l] * v_high[l * m + c];
  return static_cast<float>(static_cast<double>(x) - sum);
}

// Element i of the sum of `parts` partial vectors of `count` doubles laid out part by part,
// added in part order from 0.
ENGINE_HD inline double osft_sum_partials_element(const double* partial, int64_t parts,
                                                  int64_t count, int64_t i) {
  double sum = 0;
  for (int64_t p = 0; p < parts; ++p)
    sum += partial[p * count + i];
  return sum;
}

}  // namespace optim::kmath
