// The CPU backend's elementwise family (core/ops/elementwise.h). Elementwise updates and
// activations, kernel_math.h per element (elementwise_kernels.h).
#include <algorithm>
#include <string>

#include "core/check.h"
#include "core/cpu/bf16_rounding.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/elementwise_kernels.h"
#include "core/cpu/parallel_loops.h"

namespace core {

void CpuBackend::add(float* out, const float* a, const float* b, int64_t n) {
  cpu::add(out, a, b, n);
}

void CpuBackend::scale(float* x, float alpha, int64_t n) {
  cpu::scale(x, alpha, n);
}

void CpuBackend::scale_many(std::span<const std::span<float>> xs, float alpha) {
  for (std::span<float> x : xs)
    cpu::scale(x.data(), alpha, static_cast<int64_t>(x.size()));
}

void CpuBackend::scale_many_by(std::span<const std::span<float>> xs, const float* alpha) {
  scale_many(xs, *alpha);
}

void CpuBackend::axpby(float* y, float a, const float* x, float b, int64_t n) {
  cpu::axpby(y, a, x, b, n);
}

void CpuBackend::scalar_mix(float* out, const float* wa, const float* a, const float* wb,
                            const float* b, int64_t n) {
  cpu::scalar_mix(out, wa, a, wb, b, n);
}

void CpuBackend::scalar_mix_backward(float* da, float* db, float* dwa, float* dwb, const float* wa,
                                     const float* a, const float* wb, const float* b,
                                     const float* dout, int64_t n) {
  cpu::scalar_mix_backward(da, db, dwa, dwb, wa, a, wb, b, dout, n);
}

void CpuBackend::scalar_mix(bf16* out, const float* wa, const bf16* a, const float* wb,
                            const bf16* b, int64_t n) {
  cpu::scalar_mix(out, wa, a, wb, b, n);
}

void CpuBackend::scalar_mix_backward(float* da, float* db, float* dwa, float* dwb, const float* wa,
                                     const bf16* a, const float* wb, const bf16* b,
                                     const float* dout, int64_t n) {
  cpu::scalar_mix_backward(da, db, dwa, dwb, wa, a, wb, b, dout, n);
}

void CpuBackend::coef_add(float* out, const float* x, const float* c, int64_t c_stride,
                          const float* src, int64_t N, int64_t D) {
  cpu::coef_add(out, x, c, c_stride, src, N, D);
}

void CpuBackend::coef_add(bf16* out, const bf16* x, const float* c, int64_t c_stride,
                          const float* src, int64_t N, int64_t D) {
  cpu::coef_add(out, x, c, c_stride, src, N, D);
}

void CpuBackend::coef_add_backward(float* dsrc, float* dc, const float* c, int64_t c_stride,
                                   const float* src, const float* dout, int64_t N, int64_t D) {
  cpu::coef_add_backward(dsrc, dc, c, c_stride, src, dout, N, D);
}

// The rounding in blocks (cpu::round_to_bf16: vcvtne2ps2bf16 where the CPU has it); the widening
// as a plain loop over restrict pointers (through cpu::elementwise's lambda GCC keeps it scalar,
// measured 3x slower on 51M elements).
void CpuBackend::f32_to_bf16(bf16* out, const float* in, int64_t n) {
  const int64_t blocks = (n + cpu::kStoreBlock - 1) / cpu::kStoreBlock;
#pragma omp parallel for schedule(static) if (n > cpu::kParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i0 = b * cpu::kStoreBlock;
    cpu::round_to_bf16(out + i0, in + i0, std::min(cpu::kStoreBlock, n - i0));
  }
}

void CpuBackend::bf16_to_f32(float* out, const bf16* in, int64_t n) {
  float* __restrict o = out;
  const bf16* __restrict x = in;
#pragma omp parallel for simd schedule(static) if (n > cpu::kParallelMin)
  for (int64_t i = 0; i < n; ++i)
    o[i] = kmath::float_from_bf16(x[i]);
}

void CpuBackend::lerp(float* a, const float* b, float w, int64_t n) {
  cpu::elementwise<float>(n, [=](int64_t i) { a[i] = kmath::lerp(a[i], b[i], w); });
}

void CpuBackend::add_scaled(float* y, float a, const float* x, int64_t n) {
  cpu::elementwise<float>(n, [=](int64_t i) { y[i] = kmath::add_scaled(y[i], a, x[i]); });
}

void CpuBackend::gelu_forward(float* out, const float* inp, int64_t n) {
  cpu::gelu_forward(out, inp, n);
}

void CpuBackend::gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  cpu::gelu_backward(dinp, inp, dout, n);
}

namespace {

void check_row_scale(const char* op, int64_t c_stride, int64_t rows, int64_t cols) {
  ENGINE_CHECK(c_stride >= 1 && rows >= 0 && cols >= 0,
               std::string("cpu: ") + op + ": the coefficient stride must be >= 1 (got " +
                   std::to_string(c_stride) + "), the sizes >= 0");
}

}  // namespace

void CpuBackend::row_scale_add(float* out, const float* c, int64_t c_stride, const float* a,
                               int64_t rows, int64_t cols, bool accumulate) {
  check_row_scale("row_scale_add", c_stride, rows, cols);
  cpu::row_scale_add(out, c, c_stride, a, rows, cols, accumulate);
}

void CpuBackend::row_scale_add(bf16* out, const float* c, int64_t c_stride, const bf16* a,
                               int64_t rows, int64_t cols, bool accumulate) {
  check_row_scale("row_scale_add", c_stride, rows, cols);
  cpu::row_scale_add(out, c, c_stride, a, rows, cols, accumulate);
}

void CpuBackend::row_scale_add_backward(float* da, float* dc, const float* c, int64_t c_stride,
                                        const float* a, const float* dout, int64_t rows,
                                        int64_t cols) {
  check_row_scale("row_scale_add_backward", c_stride, rows, cols);
  cpu::row_scale_add_backward(da, dc, c, c_stride, a, dout, rows, cols);
}

void CpuBackend::row_scale_add_backward(float* da, float* dc, const float* c, int64_t c_stride,
                                        const bf16* a, const float* dout, int64_t rows,
                                        int64_t cols) {
  check_row_scale("row_scale_add_backward", c_stride, rows, cols);
  cpu::row_scale_add_backward(da, dc, c, c_stride, a, dout, rows, cols);
}

void CpuBackend::sigmoid_forward(float* out, const float* inp, float gain, int64_t n) {
  cpu::sigmoid_forward(out, inp, gain, n);
}

void CpuBackend::sigmoid_backward(float* dinp, const float* inp, const float* dout, float gain,
                                  int64_t n) {
  cpu::sigmoid_backward(dinp, inp, dout, gain, n);
}

void CpuBackend::sigmoid_scale(float* out, const float* lambda, const float* c, int64_t c_stride,
                               int64_t n) {
  check_row_scale("sigmoid_scale", c_stride, n, 1);
  cpu::sigmoid_scale(out, lambda, c, c_stride, n);
}

void CpuBackend::sigmoid_scale_backward(float* dc, float* dlambda, const float* lambda,
                                        const float* c, int64_t c_stride, const float* dout,
                                        int64_t n) {
  check_row_scale("sigmoid_scale_backward", c_stride, n, 1);
  cpu::sigmoid_scale_backward(dc, dlambda, lambda, c, c_stride, dout, n);
}

void CpuBackend::gelu_erf_forward(float* out, const float* inp, int64_t n) {
  cpu::gelu_erf_forward(out, inp, n);
}

void CpuBackend::gelu_erf_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  cpu::gelu_erf_backward(dinp, inp, dout, n);
}

void CpuBackend::relu2_forward(float* out, const float* inp, int64_t n) {
  cpu::relu2_forward(out, inp, n);
}

void CpuBackend::relu2_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  cpu::relu2_backward(dinp, inp, dout, n);
}

void CpuBackend::gelu_forward(bf16* out, const float* inp, int64_t n) {
  cpu::gelu_forward(out, inp, n);
}

void CpuBackend::gelu_backward(bf16* dinp, const float* inp, const float* dout, int64_t n) {
  cpu::gelu_backward(dinp, inp, dout, n);
}

void CpuBackend::relu2_forward(bf16* out, const float* inp, int64_t n) {
  cpu::relu2_forward(out, inp, n);
}

void CpuBackend::relu2_backward(bf16* dinp, const float* inp, const float* dout, int64_t n) {
  cpu::relu2_backward(dinp, inp, dout, n);
}

}  // namespace core
