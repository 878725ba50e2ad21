// The CPU embedding kernels: the token lookup and its gradient, and the check of token ids the
// row gathers share.
// Templated on the scalar type: the backend instantiates them for float, the tests also for
// double (central finite differences); the element math is core/kernel_math.h's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/check.h"
#include "core/cpu/bf16_rounding.h"
#include "core/cpu/parallel_loops.h"

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

}  // namespace core::cpu
