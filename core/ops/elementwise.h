// Op family: Elementwise arithmetic and activations over n contiguous floats.
// A part of the Backend interface (core/backend.h: the conventions for pointers, shapes and
// accumulation); implemented per device in core/cpu/elementwise.cpp and core/cuda/elementwise.cu.
#pragma once

#include <cstdint>
#include <span>

#include "core/device.h"
#include "core/kernel_math.h"

namespace core {

class ElementwiseOps {
 public:
  virtual ~ElementwiseOps() = default;

  virtual void add(float* out, const float* a, const float* b, int64_t n) = 0;  // in place ok
  virtual void scale(float* x, float alpha, int64_t n) = 0;                     // x *= alpha
  // x *= alpha for every tensor of the list (on a device, one launch for all of them); the
  // tensors must not overlap.
  virtual void scale_many(std::span<const std::span<float>> xs, float alpha) = 0;
  // The same with alpha read on the device (*alpha, in this backend's memory).
  virtual void scale_many_by(std::span<const std::span<float>> xs, const float* alpha) = 0;
  virtual void axpby(float* y, float a, const float* x, float b, int64_t n) = 0;  // y = a x + b y
  // a <- torch.lerp(a, b, w) over n elements, in float (kmath::lerp).
  virtual void lerp(float* a, const float* b, float w, int64_t n) = 0;
  // y <- y + a x over n elements, in float (kmath::add_scaled); x may equal y.
  virtual void add_scaled(float* y, float a, const float* x, int64_t n) = 0;
  // out = (wa ? wa[0] : 1) a + wb[0] b over n elements, the weights read on the device (the
  // model's learned scalars: U-net skip weights, x0 and value-embedding lambdas); without b
  // (null) out = (wa ? wa[0] : 1) a, and the backward leaves db and dwb alone.
  virtual void scalar_mix(float* out, const float* wa, const float* a, const float* wb,
                          const float* b, int64_t n) = 0;
  // Its backward from dout: da += wa dout, db += wb dout, dwa[0] += sum_i dout_i a_i (when wa),
  // dwb[0] += sum_i dout_i b_i (each sum in a fixed order).
  virtual void scalar_mix_backward(float* da, float* db, float* dwa, float* dwb, const float* wa,
                                   const float* a, const float* wb, const float* b,
                                   const float* dout, int64_t n) = 0;
  // The mix over bf16 precision's residual stream: a and b stored bf16 (widened exactly), out
  // stored bf16 (the f32 value rounded once); the backward reads the bf16 a and b for the weight
  // gradients, which stay f32 like da and db.
  virtual void scalar_mix(bf16* out, const float* wa, const bf16* a, const float* wb, const bf16* b,
                          int64_t n) = 0;
  virtual void scalar_mix_backward(float* da, float* db, float* dwa, float* dwb, const float* wa,
                                   const bf16* a, const float* wb, const bf16* b, const float* dout,
                                   int64_t n) = 0;
  // Record #89's gated injections (the bigram embedding added with a per-block gate): out[n, :] =
  // x[n, :] + c[n c_stride] src[n, :] over N rows of D, the coefficients a model::CoefView's
  // (c_stride 0: one for every row). On bf16 precision's stream x and out are bf16 (the f32 value
  // rounded once); src stays f32. out may be x.
  virtual void coef_add(float* out, const float* x, const float* c, int64_t c_stride,
                        const float* src, int64_t N, int64_t D) = 0;
  virtual void coef_add(bf16* out, const bf16* x, const float* c, int64_t c_stride,
                        const float* src, int64_t N, int64_t D) = 0;
  // Its backward (d x is dout itself): dsrc[n, :] += c_n dout[n, :] (when dsrc), dc[n c_stride]
  // += <src[n, :], dout[n, :]> (when dc; stride 0: every row's dot into dc[0]), each sum in a
  // fixed order.
  virtual void coef_add_backward(float* dsrc, float* dc, const float* c, int64_t c_stride,
                                 const float* src, const float* dout, int64_t N, int64_t D) = 0;
  // Per-row coefficients (record #89's per-token gates and MUDD coefficients: a column of a
  // [rows, K] array read at stride c_stride >= 1): out[r, :] = c[r c_stride] a[r, :] over
  // [rows, cols], plus out's own value when accumulate; out may equal a. On bf16 precision's
  // stream a and out are bf16 (widened exactly, each output the f32 value rounded once).
  virtual void row_scale_add(float* out, const float* c, int64_t c_stride, const float* a,
                             int64_t rows, int64_t cols, bool accumulate) = 0;
  virtual void row_scale_add(bf16* out, const float* c, int64_t c_stride, const bf16* a,
                             int64_t rows, int64_t cols, bool accumulate) = 0;
  // Its backward from dout: da[r, :] += c[r c_stride] dout[r, :] (da not null) and dc[r c_stride]
  // += <a[r, :], dout[r, :]> (dc not null; each row's dot in a fixed order).
  virtual void row_scale_add_backward(float* da, float* dc, const float* c, int64_t c_stride,
                                      const float* a, const float* dout, int64_t rows,
                                      int64_t cols) = 0;
  virtual void row_scale_add_backward(float* da, float* dc, const float* c, int64_t c_stride,
                                      const bf16* a, const float* dout, int64_t rows,
                                      int64_t cols) = 0;
  // A scaled sigmoid, gain / (1 + exp(-u)) (record #89's value-embedding gates, gain 2); the
  // backward accumulates dinp += gain s (1 - s) dout.
  virtual void sigmoid_forward(float* out, const float* inp, float gain, int64_t n) = 0;
  virtual void sigmoid_backward(float* dinp, const float* inp, const float* dout, float gain,
                                int64_t n) = 0;
  // A column scaled by the sigmoid of a learned scalar (record #89's skip gate
  // sigmoid(skip_lambda) g[n]): out[i] = sigmoid(lambda[0]) c[i c_stride] for i < n,
  // c_stride >= 1.
  virtual void sigmoid_scale(float* out, const float* lambda, const float* c, int64_t c_stride,
                             int64_t n) = 0;
  // Its backward from dout: dc[i c_stride] += sigmoid(lambda) dout[i] (dc not null) and
  // dlambda[0] += sigmoid'(lambda) sum_i c[i c_stride] dout[i] (a sum in a fixed order).
  virtual void sigmoid_scale_backward(float* dc, float* dlambda, const float* lambda,
                                      const float* c, int64_t c_stride, const float* dout,
                                      int64_t n) = 0;
  // bf16 <-> f32 over n elements (kmath::bf16_from_float: nearest, ties to even; NaN and
  // infinity kept; the other way exact).
  virtual void f32_to_bf16(bf16* out, const float* in, int64_t n) = 0;
  virtual void bf16_to_f32(float* out, const bf16* in, int64_t n) = 0;
  // GELU, tanh form: 0.5 u (1 + tanh(sqrt(2/pi) (u + 0.044715 u^3))).
  virtual void gelu_forward(float* out, const float* inp, int64_t n) = 0;
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) = 0;
  // bf16 precision: the output stored as bf16 (a GEMM input), and d inp stored as bf16 (the
  // output gradient of the layer before, which feeds its GEMMs); the bf16 backward is d inp's
  // only producer and writes it (=). Each value is the f32 one rounded.
  virtual void gelu_forward(bf16* out, const float* inp, int64_t n) = 0;
  virtual void gelu_backward(bf16* dinp, const float* inp, const float* dout, int64_t n) = 0;
  // GELU, exact (erf) form: 0.5 u (1 + erf(u / sqrt 2)); the backward accumulates (+=).
  virtual void gelu_erf_forward(float* out, const float* inp, int64_t n) = 0;
  virtual void gelu_erf_backward(float* dinp, const float* inp, const float* dout, int64_t n) = 0;
  // ReLU^2: max(u, 0)^2.
  virtual void relu2_forward(float* out, const float* inp, int64_t n) = 0;
  virtual void relu2_backward(float* dinp, const float* inp, const float* dout, int64_t n) = 0;
  virtual void relu2_forward(bf16* out, const float* inp, int64_t n) = 0;
  virtual void relu2_backward(bf16* dinp, const float* inp, const float* dout, int64_t n) = 0;
};

}  // namespace core
