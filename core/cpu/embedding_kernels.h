// The CPU embedding kernels: the token lookup and its gradient, the check of token ids the row
// gathers share, and record #89's input side (the bigram hash and sign trick, the smear).
// Templated on the scalar type: the backend instantiates them for float, the tests also for
// double (central finite differences); the element math is core/kernel_math.h's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/cpu/bf16_rounding.h"
#include "core/cpu/parallel_loops.h"
#include "core/kernel_math.h"

namespace core::cpu {

inline void check_tokens(const int32_t* tokens, int64_t n, const char* op) {
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0) {
      ENGINE_FAIL(std::string(op) + ": negative token id " + std::to_string(tokens[i]) +
                  " at position " + std::to_string(i));
    }
  }
}

// Out = bf16 (T = float): bf16 precision's residual stream, each row the f32 sum rounded once.
template <typename T, typename Out = T>
void embedding_forward(Out* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t B,
                       int64_t T_, int64_t D) {
  check_tokens(tokens, B * T_, "embedding_forward");
#pragma omp parallel for schedule(static) if (B * T_ * D > kParallelMin)
  for (int64_t i = 0; i < B * T_; ++i) {
    const T* e = wte + static_cast<int64_t>(tokens[i]) * D;
    const T* p = wpe ? wpe + (i % T_) * D : nullptr;
    const RowStore<T, Out> store(out + i * D, D);
    T* o = store.row();
    for (int64_t d = 0; d < D; ++d)
      o[d] = e[d] + (p ? p[d] : T(0));
    store.commit();
  }
}

// Threads own disjoint column ranges, so repeated tokens never race and the order of additions
// into each row of dwte is the token order whatever the thread count.
template <typename T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t B,
                        int64_t T_, int64_t D) {
  check_tokens(tokens, B * T_, "embedding_backward");
  constexpr int64_t kCols = 64;
  int64_t col_blocks = (D + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if (B * T_ * D > kParallelMin)
  for (int64_t cb = 0; cb < col_blocks; ++cb) {
    int64_t c0 = cb * kCols, c1 = std::min(D, c0 + kCols);
    for (int64_t i = 0; i < B * T_; ++i) {
      T* w = dwte + static_cast<int64_t>(tokens[i]) * D;
      const T* g = dout + i * D;
      for (int64_t c = c0; c < c1; ++c)
        w[c] += g[c];
    }
  }
  if (dwpe) {
#pragma omp parallel for schedule(static) if (B * T_ * D > kParallelMin)
    for (int64_t t = 0; t < T_; ++t) {
      T* w = dwpe + t * D;
      for (int64_t b = 0; b < B; ++b) {
        const T* g = dout + (b * T_ + t) * D;
        for (int64_t d = 0; d < D; ++d)
          w[d] += g[d];
      }
    }
  }
}

// ---- record #89's input side: the bigram hash embedding, the smear -----------------------------

// EmbeddingOps::bigram_hash: each row of T tokens hashed on its own.
inline void bigram_hash(int32_t* ids, const int32_t* tokens, int64_t B, int64_t T_,
                        int64_t table_rows) {
  ENGINE_CHECK(table_rows >= 2 && table_rows - 1 <= INT32_MAX,
               "bigram_hash: table_rows must be in [2, 2^31], got " + std::to_string(table_rows));
  check_tokens(tokens, B * T_, "bigram_hash");
  const auto m = static_cast<int32_t>(table_rows - 1);
  for (int64_t i = 0; i < B * T_; ++i)
    ids[i] = kmath::bigram_hash_at(tokens + (i - i % T_), i % T_, m);
}

// EmbeddingOps::bigram_signs: x[i, :] *= signs[sign row of i, :].
template <typename T>
void bigram_signs(T* x, const int32_t* tokens, const T* signs, int64_t B, int64_t T_, int64_t D,
                  int64_t sign_rows) {
  check_tokens(tokens, B * T_, "bigram_signs");
#pragma omp parallel for schedule(static) if (B * T_ * D > kParallelMin)
  for (int64_t i = 0; i < B * T_; ++i) {
    const T* s = signs + kmath::bigram_sign_row(tokens + (i - i % T_), i % T_, sign_rows) * D;
    for (int64_t d = 0; d < D; ++d)
      x[i * D + d] *= s[d];
  }
}

// EmbeddingOps::smear_forward over rows [B, T, D]: out[t] = x[t] + lambda s_t x[t - 1] (t >= 1),
// s_t = sigmoid(x[t, :K] . w) saved in gate (0 at t = 0).
template <typename T>
void smear_forward(T* out, T* gate, const T* x, const T* w, const T* lambda, int64_t B, int64_t T_,
                   int64_t D, int64_t K) {
#pragma omp parallel for schedule(static) if (B * T_ * D > kParallelMin)
  for (int64_t i = 0; i < B * T_; ++i) {
    const T* xi = x + i * D;
    T* o = out + i * D;
    if (i % T_ == 0) {
      gate[i] = T(0);
      for (int64_t d = 0; d < D; ++d)
        o[d] = xi[d];
      continue;
    }
    T z = T(0);
    for (int64_t k = 0; k < K; ++k)
      z += xi[k] * w[k];
    const T s = kmath::sigmoid(z), g = lambda[0] * s;
    gate[i] = s;
    for (int64_t d = 0; d < D; ++d)
      o[d] = xi[d] + g * xi[d - D];
  }
}

// EmbeddingOps::smear_backward. With dg_t = <dout[t], x[t - 1]> (t >= 1) and dz_t = dg_t lambda
// s_t (1 - s_t): dx[t] = dout[t] + lambda s_{t+1} dout[t + 1] (within the row) + dz_t w on the
// first K columns (written, =); dw[k] += sum_t dz_t x[t, k], dlambda += sum_t dg_t s_t (float64
// sums in position order).
template <typename T>
void smear_backward(T* dx, T* dw, T* dlambda, const T* x, const T* w, const T* lambda,
                    const T* gate, const T* dout, int64_t B, int64_t T_, int64_t D, int64_t K) {
  const int64_t N = B * T_;
  std::vector<T> dz(static_cast<size_t>(N), T(0));
  double dlam = 0.0;
  std::vector<double> dws(static_cast<size_t>(K), 0.0);
  for (int64_t i = 0; i < N; ++i) {
    if (i % T_ == 0) continue;
    double dg = 0.0;
    for (int64_t d = 0; d < D; ++d)
      dg += double(dout[i * D + d]) * double(x[(i - 1) * D + d]);
    dlam += dg * double(gate[i]);
    dz[i] = T(dg) * kmath::smear_gate_grad_z(lambda[0], gate[i]);
    for (int64_t k = 0; k < K; ++k)
      dws[k] += double(dz[i]) * double(x[i * D + k]);
  }
  dlambda[0] += T(dlam);
  for (int64_t k = 0; k < K; ++k)
    dw[k] += T(dws[k]);
#pragma omp parallel for schedule(static) if (N * D > kParallelMin)
  for (int64_t i = 0; i < N; ++i) {
    const bool next = (i + 1) % T_ != 0;
    const T g_next = next ? lambda[0] * gate[i + 1] : T(0);
    for (int64_t d = 0; d < D; ++d) {
      T v = dout[i * D + d];
      if (next) v += g_next * dout[(i + 1) * D + d];
      if (d < K) v += dz[i] * w[d];
      dx[i * D + d] = v;
    }
  }
}

}  // namespace core::cpu
