// Op family: Normalisation over the last dimension of [N, C]: LayerNorm, RMSNorm, row softmax.
// A part of the Backend interface (core/backend.h: the conventions for pointers, shapes and
// accumulation); implemented per device in core/cpu/norms.cpp and core/cuda/norms.cu. The bf16
// forwards store the f32 result rounded (kmath::bf16_from_float).
#pragma once

#include <cstdint>

#include "core/device.h"

namespace core {

class NormOps {
 public:
  virtual ~NormOps() = default;

  // LayerNorm with weight and bias; saves mean[N], rstd[N] for the backward.
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                 const float* weight, const float* bias, int64_t N, int64_t C,
                                 float eps) = 0;
  // The same, out stored as bf16 (bf16 precision: a GEMM input); the statistics stay f32.
  virtual void layernorm_forward(bf16* out, float* mean, float* rstd, const float* inp,
                                 const float* weight, const float* bias, int64_t N, int64_t C,
                                 float eps) = 0;
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                  const float* inp, const float* weight, const float* mean,
                                  const float* rstd, int64_t N, int64_t C) = 0;
  // RMSNorm without weight: out = inp / sqrt(mean(inp^2) + eps); saves rstd[N].
  virtual void rmsnorm_forward(float* out, float* rstd, const float* inp, int64_t N, int64_t C,
                               float eps) = 0;
  virtual void rmsnorm_forward(bf16* out, float* rstd, const float* inp, int64_t N, int64_t C,
                               float eps) = 0;
  virtual void rmsnorm_backward(float* dinp, const float* dout, const float* inp, const float* rstd,
                                int64_t N, int64_t C) = 0;
  // bf16 precision's residual stream: the input stored bf16, widened exactly (the values are the
  // f32 op's on the widened input; the statistics and d inp stay f32).
  virtual void layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp,
                                 const float* weight, const float* bias, int64_t N, int64_t C,
                                 float eps) = 0;
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                  const bf16* inp, const float* weight, const float* mean,
                                  const float* rstd, int64_t N, int64_t C) = 0;
  virtual void rmsnorm_forward(bf16* out, float* rstd, const bf16* inp, int64_t N, int64_t C,
                               float eps) = 0;
  virtual void rmsnorm_backward(float* dinp, const float* dout, const bf16* inp, const float* rstd,
                                int64_t N, int64_t C) = 0;
  // Row softmax of [N, C] (router probabilities); backward from the saved output.
  virtual void softmax_forward(float* out, const float* inp, int64_t N, int64_t C) = 0;
  virtual void softmax_backward(float* dinp, const float* dout, const float* out, int64_t N,
                                int64_t C) = 0;
};

}  // namespace core
