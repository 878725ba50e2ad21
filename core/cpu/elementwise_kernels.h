// The CPU elementwise kernels: sums, scalings, learned-scalar mixes, gated injections, GELU and
// ReLU^2 with their gradients. Templated on the scalar type: the backend instantiates them for
// float, the tests also for double (central finite differences); the element math is
// core/kernel_math.h's. The activations also store bf16 (Out = bf16, T = float: the f32 values
// rounded, elementwise_store): the forward its output, the backward d pre, which it then writes (=)
// instead of accumulating.
#pragma once

#include <cstdint>

#include "core/cpu/bf16_rounding.h"
#include "core/cpu/fast_math.h"
#include "core/cpu/parallel_loops.h"
#include "core/kernel_math.h"

namespace core::cpu {

template <typename T>
void add(T* out, const T* a, const T* b, int64_t n) {
  elementwise<T>(n, [=](int64_t i) { out[i] = a[i] + b[i]; });
}
template <typename T>
void scale(T* x, T alpha, int64_t n) {
  elementwise<T>(n, [=](int64_t i) { x[i] *= alpha; });
}
template <typename T>
void axpby(T* y, T a, const T* x, T b, int64_t n) {
  elementwise<T>(n, [=](int64_t i) { y[i] = a * x[i] + b * y[i]; });
}
// The mixes also run on bf16 precision's residual stream (In = Out = bf16, T = float): the
// inputs widened exactly, each output the f32 value rounded once; the weight gradients f32.
template <typename T, typename Out = T, typename In = T>
void scalar_mix(Out* out, const T* wa, const In* a, const T* wb, const In* b, int64_t n) {
  const T ca = wa ? wa[0] : T(1);
  if (!b) {
    elementwise_store<T>(out, n, [=](int64_t i) { return ca * widen<T>(a[i]); });
    return;
  }
  const T cb = wb[0];
  elementwise_store<T>(out, n,
                       [=](int64_t i) { return ca * widen<T>(a[i]) + cb * widen<T>(b[i]); });
}
// The weight gradients are float64 sums in index order, before the elementwise part (so the
// result does not depend on the thread count).
template <typename T, typename In = T>
void scalar_mix_backward(T* da, T* db, T* dwa, T* dwb, const T* wa, const In* a, const T* wb,
                         const In* b, const T* dout, int64_t n) {
  double sa = 0.0, sb = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (wa) sa += double(dout[i]) * double(widen<T>(a[i]));
    if (b) sb += double(dout[i]) * double(widen<T>(b[i]));
  }
  if (wa) dwa[0] += T(sa);
  if (b) dwb[0] += T(sb);
  const T ca = wa ? wa[0] : T(1);
  if (!b) {
    elementwise<T>(n, [=](int64_t i) { da[i] += ca * dout[i]; });
    return;
  }
  const T cb = wb[0];
  elementwise<T>(n, [=](int64_t i) {
    da[i] += ca * dout[i];
    db[i] += cb * dout[i];
  });
}
// Record #89's gated injections (ElementwiseOps::coef_add): out[n, :] = x[n, :] + c_n src[n, :],
// c_n = c[n c_stride]; on bf16 precision's stream x and out bf16 (Out = In = bf16, T = float).
template <typename T, typename Out = T, typename In = T>
void coef_add(Out* out, const In* x, const T* c, int64_t c_stride, const T* src, int64_t N,
              int64_t D) {
  elementwise_store<T>(out, N * D,
                       [=](int64_t i) { return widen<T>(x[i]) + c[(i / D) * c_stride] * src[i]; });
}
// Its backward: each row's dot <src, dout> a float64 sum in column order, the rows added into dc
// in row order (stride 0: into one coefficient), then dsrc += c dout.
template <typename T>
void coef_add_backward(T* dsrc, T* dc, const T* c, int64_t c_stride, const T* src, const T* dout,
                       int64_t N, int64_t D) {
  if (dc) {
    for (int64_t n = 0; n < N; ++n) {
      double s = 0.0;
      for (int64_t d = 0; d < D; ++d)
        s += double(src[n * D + d]) * double(dout[n * D + d]);
      dc[n * c_stride] += T(s);
    }
  }
  if (dsrc) elementwise<T>(N * D, [=](int64_t i) { dsrc[i] += c[(i / D) * c_stride] * dout[i]; });
}
// Per-row coefficients at stride s: out[r, :] = c[r s] a[r, :] (+ out[r, :]); the backward's
// row dots are float64 sums in column order, one row per thread.
template <typename T, typename Out = T, typename In = T>
void row_scale_add(Out* out, const T* c, int64_t s, const In* a, int64_t rows, int64_t cols,
                   bool accumulate) {
  elementwise_store<T>(out, rows * cols, [=](int64_t i) {
    const T v = c[(i / cols) * s] * widen<T>(a[i]);
    return accumulate ? widen<T>(out[i]) + v : v;
  });
}
template <typename T, typename In = T>
void row_scale_add_backward(T* da, T* dc, const T* c, int64_t s, const In* a, const T* dout,
                            int64_t rows, int64_t cols) {
  if (dc) {
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
    for (int64_t r = 0; r < rows; ++r) {
      double dot = 0.0;
      for (int64_t j = 0; j < cols; ++j)
        dot += double(dout[r * cols + j]) * double(widen<T>(a[r * cols + j]));
      dc[r * s] += T(dot);
    }
  }
  if (da) elementwise<T>(rows * cols, [=](int64_t i) { da[i] += c[(i / cols) * s] * dout[i]; });
}
template <typename T>
void sigmoid_forward(T* out, const T* inp, T gain, int64_t n) {
  elementwise<T>(n, [=](int64_t i) { out[i] = gain * kmath::sigmoid(inp[i]); });
}
template <typename T>
void sigmoid_backward(T* dinp, const T* inp, const T* dout, T gain, int64_t n) {
  elementwise<T>(n, [=](int64_t i) {
    const T s = kmath::sigmoid(inp[i]);
    dinp[i] += gain * s * (T(1) - s) * dout[i];
  });
}
// out[i] = sigmoid(lambda) c[i s]; the backward's sum over i in float64, in index order.
template <typename T>
void sigmoid_scale(T* out, const T* lambda, const T* c, int64_t s, int64_t n) {
  const T g = kmath::sigmoid(lambda[0]);
  elementwise<T>(n, [=](int64_t i) { out[i] = g * c[i * s]; });
}
template <typename T>
void sigmoid_scale_backward(T* dc, T* dlambda, const T* lambda, const T* c, int64_t s,
                            const T* dout, int64_t n) {
  const T g = kmath::sigmoid(lambda[0]);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i)
    sum += double(c[i * s]) * double(dout[i]);
  dlambda[0] += T(double(g) * (1.0 - double(g)) * sum);
  if (dc)
    for (int64_t i = 0; i < n; ++i)
      dc[i * s] += g * dout[i];
}
template <typename T, typename Out = T>
void gelu_forward(Out* out, const T* inp, int64_t n) {
  elementwise_store<T>(out, n, [=](int64_t i) { return kmath::gelu_tanh<FastMath>(inp[i]); });
}
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n) {
  elementwise<T>(n,
                 [=](int64_t i) { dinp[i] += kmath::gelu_tanh_grad<FastMath>(inp[i]) * dout[i]; });
}
template <typename T>
void gelu_backward(bf16* dinp, const T* inp, const T* dout, int64_t n) {
  elementwise_store<T>(
      dinp, n, [=](int64_t i) { return kmath::gelu_tanh_grad<FastMath>(inp[i]) * dout[i]; });
}
// GELU's exact (erf) form, f32 only (record #89's MUDD blocks).
template <typename T>
void gelu_erf_forward(T* out, const T* inp, int64_t n) {
  elementwise<T>(n, [=](int64_t i) { out[i] = kmath::gelu_erf(inp[i]); });
}
template <typename T>
void gelu_erf_backward(T* dinp, const T* inp, const T* dout, int64_t n) {
  elementwise<T>(n, [=](int64_t i) { dinp[i] += kmath::gelu_erf_grad(inp[i]) * dout[i]; });
}
template <typename T, typename Out = T>
void relu2_forward(Out* out, const T* inp, int64_t n) {
  elementwise_store<T>(out, n, [=](int64_t i) { return kmath::relu2(inp[i]); });
}
template <typename T>
void relu2_backward(T* dinp, const T* inp, const T* dout, int64_t n) {
  elementwise<T>(n, [=](int64_t i) { dinp[i] += kmath::relu2_grad(inp[i]) * dout[i]; });
}
template <typename T>
void relu2_backward(bf16* dinp, const T* inp, const T* dout, int64_t n) {
  elementwise_store<T>(dinp, n, [=](int64_t i) { return kmath::relu2_grad(inp[i]) * dout[i]; });
}

}  // namespace core::cpu
