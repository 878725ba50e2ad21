// The CPU GEMM family's own kernels: a bias added to every row and its gradient (column sums
// in fixed blocks). The GEMMs themselves are cpu_gemm.h's.
// Templated on the scalar type: the backend instantiates them for float, the tests also for
// double (central finite differences); the element math is core/kernel_math.h's. The bias
// gradient also reads a bf16 output gradient.
#pragma once

#include <cstdint>

#include "core/cpu/bf16_rounding.h"
#include "core/cpu/parallel_loops.h"

namespace core::cpu {

template <typename T>
void add_bias(T* out, const T* bias, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    T* o = out + n * C;
    for (int64_t c = 0; c < C; ++c)
      o[c] += bias[c];
  }
}

// dout is T, or bf16 (T = float: the stored output gradient of bf16 precision, widened exactly).
template <typename T, typename G = T>
void bias_backward(T* dbias, const G* dout, int64_t N, int64_t C) {
  T* dst[1] = {dbias};
  blocked_column_sums(dst, 1, N, C, [&](int64_t n, T* p) {
    const G* g = dout + n * C;
    for (int64_t c = 0; c < C; ++c)
      p[c] += widen<T>(g[c]);
  });
}

}  // namespace core::cpu
