// The model's GEMMs: y = x W^T in the precision of the run (docs/precision.md), with the epilogues
// that fuse a bias, a residual add or GELU into them, and the backward's two GEMMs.
#pragma once

#include <cstdint>

#include "core/backend.h"
#include "model/model_config.h"
#include "model/residual_stream.h"

namespace model {

// One GEMM operand: a weight's f32 values and, in bf16 precision, its bf16 copy (null in f32
// precision and for weights kept in f32, the MoE router's); an activation or output gradient
// as stored: f32, or in bf16 precision bf16 only. A GEMM runs in bf16 when both of its operands
// have bf16.
struct Operand {
  const float* f32 = nullptr;
  const core::bf16* bf16 = nullptr;
  Operand at(int64_t offset) const {
    return {f32 ? f32 + offset : nullptr, bf16 ? bf16 + offset : nullptr};
  }
};

class Linear {
 public:
  Linear(core::Backend& backend, Precision precision) : backend_(backend), precision_(precision) {}

  // The bf16 scratch the backward rounds an f32 output gradient into (rows x out of the largest
  // call), set by the activation plan.
  void set_dy_scratch(core::bf16* dy_bf16) { dy_bf16_ = dy_bf16; }

  // y[N, out] (+)= alpha x[N, in] @ W[out, in]^T.
  void forward(float* y, Operand x, Operand weight, int64_t N, int64_t in, int64_t out,
               float beta = 0.0f, float alpha = 1.0f);
  // y[N, out] = alpha x[N, in] @ W[out, in]^T stored in bf16 (each f32 sum rounded once): the
  // bf16 head's logits. Both operands must have bf16.
  void forward(core::bf16* y, Operand x, Operand weight, int64_t N, int64_t in, int64_t out,
               float alpha);
  // y[N, out] = x[N, in] @ W[out, in]^T + bias (none: null) + residual (when given: y written
  // fresh from it, C != D), in one GEMM with an epilogue (core::GemmEpilogue). With gelu_out
  // (f32), y is the pre-activation and gelu_out = gelu(y), also in the epilogue.
  void forward_epilogue(float* y, Operand x, Operand weight, const float* bias, int64_t N,
                        int64_t in, int64_t out, const float* residual = nullptr,
                        float* gelu_out = nullptr);
  // The residual add of a projection: y = residual + x[N, in] @ W[out, in]^T (+ bias) in one GEMM
  // with the residual as C, both streams f32 or both bf16 (then each sum rounded once).
  void residual_forward(Stream y, Operand x, Operand weight, const float* bias, int64_t N,
                        int64_t in, int64_t out, Stream residual);
  // dx[N, in] (+)= dy[N, out] @ W[out, in];  dW[out, in] += dy^T @ x. When the GEMMs run in
  // bf16, dy is given as stored in bf16 by its producer (dy_rounded: d logits, d pre, d qkv) or
  // rounded here from f32 (the residual stream's gradient, the MoE rows'). dbias (when not null)
  // += the column sums of dy as the bias gradient reads it: fused into the dW GEMM (bgrad) when
  // that GEMM multiplies the same values, else from the f32 dy before its rounding. With
  // dx_gelu_pre (f32 GEMMs only), dx is d pre = gelu'(pre) (dy W), the activation's backward in
  // the dx GEMM's epilogue (dgelu).
  void backward(float* dx, float* dweight, const float* dy, Operand x, Operand weight, int64_t N,
                int64_t in, int64_t out, float dx_beta, const core::bf16* dy_rounded = nullptr,
                float* dbias = nullptr, float* dx_gelu_pre = nullptr);

 private:
  bool tf32() const { return precision_ == Precision::Tf32; }
  core::Backend& backend_;
  Precision precision_;
  core::bf16* dy_bf16_ = nullptr;
};

}  // namespace model
