// The CPU elementwise kernels: sums, scalings, GELU and ReLU^2 with their gradients.
// Templated on the scalar type: the backend instantiates them for float, the tests also for
// double (central finite differences); the element math is core/kernel_math.h's.
#pragma once

#include <cstdint>

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
void gelu_forward(T* out, const T* inp, int64_t n) {
  elementwise<T>(n, [=](int64_t i) { out[i] = kmath::gelu_tanh<FastMath>(inp[i]); });
}
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n) {
  elementwise<T>(n,
                 [=](int64_t i) { dinp[i] += kmath::gelu_tanh_grad<FastMath>(inp[i]) * dout[i]; });
}
template <typename T>
void relu2_forward(T* out, const T* inp, int64_t n) {
  elementwise<T>(n, [=](int64_t i) { out[i] = kmath::relu2(inp[i]); });
}
template <typename T>
void relu2_backward(T* dinp, const T* inp, const T* dout, int64_t n) {
  elementwise<T>(n, [=](int64_t i) { dinp[i] += kmath::relu2_grad(inp[i]) * dout[i]; });
}

}  // namespace core::cpu
