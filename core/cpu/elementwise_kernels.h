// The CPU elementwise kernels: sums, scalings, learned-scalar mixes, GELU and ReLU^2 with their
// gradients. Templated on the scalar type: the backend instantiates them for float, the tests also
// for double (central finite differences); the element math is core/kernel_math.h's. The
// activations also store bf16 (Out = bf16, T = float: the f32 values rounded, elementwise_store):
// the forward its output, the backward d pre, which it then writes (=) instead of accumulating.
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
template <typename T>
void scalar_mix(T* out, const T* wa, const T* a, const T* wb, const T* b, int64_t n) {
  const T ca = wa ? wa[0] : T(1), cb = wb[0];
  elementwise<T>(n, [=](int64_t i) { out[i] = ca * a[i] + cb * b[i]; });
}
// The weight gradients are float64 sums in index order, before the elementwise part (so the
// result does not depend on the thread count).
template <typename T>
void scalar_mix_backward(T* da, T* db, T* dwa, T* dwb, const T* wa, const T* a, const T* wb,
                         const T* b, const T* dout, int64_t n) {
  double sa = 0.0, sb = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (wa) sa += double(dout[i]) * double(a[i]);
    sb += double(dout[i]) * double(b[i]);
  }
  if (wa) dwa[0] += T(sa);
  dwb[0] += T(sb);
  const T ca = wa ? wa[0] : T(1), cb = wb[0];
  elementwise<T>(n, [=](int64_t i) {
    da[i] += ca * dout[i];
    db[i] += cb * dout[i];
  });
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
