// The CPU normalisation kernels: LayerNorm, RMSNorm and the row softmax, forward and backward
// (the weight and bias gradients as column sums in fixed blocks).
// Templated on the scalar type: the backend instantiates them for float, the tests also for
// double (central finite differences); the element math is core/kernel_math.h's. The forwards
// also store their output as bf16 (Out = bf16, T = float: the f32 row rounded, RowStore); the
// statistics stay T. The norms also read a bf16 input (In = bf16: the row widened exactly,
// RowLoad; bf16 precision's residual stream), so their values are the f32 kernel's on the widened
// row.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/cpu/bf16_rounding.h"
#include "core/cpu/fast_math.h"
#include "core/cpu/parallel_loops.h"
#include "core/kernel_math.h"

namespace core::cpu {

template <typename T, typename Out = T, typename In = T>
void layernorm_forward(Out* out, T* mean, T* rstd, const In* inp, const T* weight, const T* bias,
                       int64_t N, int64_t C, T eps) {
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const RowLoad<T, In> load(inp + n * C, C);
    const T* x = load.row();
    T m = T(0);
    for (int64_t c = 0; c < C; ++c)
      m += x[c];
    m /= T(C);
    T v = T(0);
    for (int64_t c = 0; c < C; ++c)
      v += (x[c] - m) * (x[c] - m);
    T r = kmath::rsqrt_eps(v / T(C), eps);
    const RowStore<T, Out> store(out + n * C, C);
    T* o = store.row();
    for (int64_t c = 0; c < C; ++c) {
      T y = (x[c] - m) * r;
      o[c] = y * (weight ? weight[c] : T(1)) + (bias ? bias[c] : T(0));
    }
    store.commit();
    if (mean) mean[n] = m;
    if (rstd) rstd[n] = r;
  }
}

// With xhat = (x - mean) rstd and g = dout * w:
// dx = rstd (g - mean(g) - xhat mean(g xhat)), dw += dout xhat, db += dout.
template <typename T, typename In = T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const In* inp,
                        const T* weight, const T* mean, const T* rstd, int64_t N, int64_t C) {
  if (dinp) {
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
    for (int64_t n = 0; n < N; ++n) {
      const RowLoad<T, In> load(inp + n * C, C);
      const T* x = load.row();
      const T* g = dout + n * C;
      T m = mean[n], r = rstd[n];
      T g_mean = T(0), gx_mean = T(0);
      for (int64_t c = 0; c < C; ++c) {
        T gw = g[c] * (weight ? weight[c] : T(1));
        g_mean += gw;
        gx_mean += gw * (x[c] - m) * r;
      }
      g_mean /= T(C);
      gx_mean /= T(C);
      T* dx = dinp + n * C;
      for (int64_t c = 0; c < C; ++c) {
        T gw = g[c] * (weight ? weight[c] : T(1));
        dx[c] += r * (gw - g_mean - (x[c] - m) * r * gx_mean);
      }
    }
  }
  if (dweight || dbias) {
    T* dst[2] = {dweight, dbias};
    blocked_column_sums(dst, 2, N, C, [&](int64_t n, T* p) {
      const RowLoad<T, In> load(inp + n * C, C);
      const T* x = load.row();
      const T* g = dout + n * C;
      T m = mean[n], r = rstd[n];
      for (int64_t c = 0; c < C; ++c) {
        p[c] += g[c] * (x[c] - m) * r;
        p[C + c] += g[c];
      }
    });
  }
}

template <typename T, typename Out = T, typename In = T>
void rmsnorm_forward(Out* out, T* rstd, const In* inp, int64_t N, int64_t C, T eps) {
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const RowLoad<T, In> load(inp + n * C, C);
    const T* x = load.row();
    T ss = T(0);
    for (int64_t c = 0; c < C; ++c)
      ss += x[c] * x[c];
    T r = kmath::rsqrt_eps(ss / T(C), eps);
    const RowStore<T, Out> store(out + n * C, C);
    T* o = store.row();
    for (int64_t c = 0; c < C; ++c)
      o[c] = x[c] * r;
    store.commit();
    if (rstd) rstd[n] = r;
  }
}

// y = x r with r = (mean(x^2) + eps)^(-1/2): dx = r (g - y mean(g y)).
template <typename T, typename In = T>
void rmsnorm_backward(T* dinp, const T* dout, const In* inp, const T* rstd, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const RowLoad<T, In> load(inp + n * C, C);
    const T* x = load.row();
    const T* g = dout + n * C;
    T r = rstd[n];
    T gy = T(0);
    for (int64_t c = 0; c < C; ++c)
      gy += g[c] * x[c] * r;
    gy /= T(C);
    T* dx = dinp + n * C;
    for (int64_t c = 0; c < C; ++c)
      dx[c] += r * (g[c] - x[c] * r * gy);
  }
}

template <typename T>
void softmax_forward(T* out, const T* inp, int64_t N, int64_t C) {
  if (C == 0) return;
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    T* o = out + n * C;
    T mx = row_max(x, C);
    T s = T(0);
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; ++c) {
      o[c] = FastMath::exp(x[c] - mx);
      s += o[c];
    }
    T inv = T(1) / s;
    for (int64_t c = 0; c < C; ++c)
      o[c] *= inv;
  }
}

// dx = y (g - sum(g y)).
template <typename T>
void softmax_backward(T* dinp, const T* dout, const T* out, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* g = dout + n * C;
    const T* y = out + n * C;
    T dot = T(0);
    for (int64_t c = 0; c < C; ++c)
      dot += g[c] * y[c];
    T* dx = dinp + n * C;
    for (int64_t c = 0; c < C; ++c)
      dx[c] += y[c] * (g[c] - dot);
  }
}

}  // namespace core::cpu
