// The CPU backend's norms family (core/ops/norms.h). LayerNorm, RMSNorm and the row softmax,
// forward and backward (norm_kernels.h).
#include "core/cpu/cpu_backend.h"
#include "core/cpu/norm_kernels.h"

namespace core {

void CpuBackend::layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                   const float* weight, const float* bias, int64_t N, int64_t C,
                                   float eps) {
  cpu::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps);
}

void CpuBackend::layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                    const float* inp, const float* weight, const float* mean,
                                    const float* rstd, int64_t N, int64_t C) {
  cpu::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}

void CpuBackend::rmsnorm_forward(float* out, float* rstd, const float* inp, int64_t N, int64_t C,
                                 float eps) {
  cpu::rmsnorm_forward(out, rstd, inp, N, C, eps);
}

void CpuBackend::rmsnorm_backward(float* dinp, const float* dout, const float* inp,
                                  const float* rstd, int64_t N, int64_t C) {
  cpu::rmsnorm_backward(dinp, dout, inp, rstd, N, C);
}

void CpuBackend::softmax_forward(float* out, const float* inp, int64_t N, int64_t C) {
  cpu::softmax_forward(out, inp, N, C);
}

void CpuBackend::softmax_backward(float* dinp, const float* dout, const float* out, int64_t N,
                                  int64_t C) {
  cpu::softmax_backward(dinp, dout, out, N, C);
}

void CpuBackend::layernorm_forward(bf16* out, float* mean, float* rstd, const float* inp,
                                   const float* weight, const float* bias, int64_t N, int64_t C,
                                   float eps) {
  cpu::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps);
}

void CpuBackend::rmsnorm_forward(bf16* out, float* rstd, const float* inp, int64_t N, int64_t C,
                                 float eps) {
  cpu::rmsnorm_forward(out, rstd, inp, N, C, eps);
}

void CpuBackend::layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp,
                                   const float* weight, const float* bias, int64_t N, int64_t C,
                                   float eps) {
  cpu::layernorm_forward(out, mean, rstd, inp, weight, bias, N, C, eps);
}

void CpuBackend::layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                    const bf16* inp, const float* weight, const float* mean,
                                    const float* rstd, int64_t N, int64_t C) {
  cpu::layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C);
}

void CpuBackend::rmsnorm_forward(bf16* out, float* rstd, const bf16* inp, int64_t N, int64_t C,
                                 float eps) {
  cpu::rmsnorm_forward(out, rstd, inp, N, C, eps);
}

void CpuBackend::rmsnorm_backward(float* dinp, const float* dout, const bf16* inp,
                                  const float* rstd, int64_t N, int64_t C) {
  cpu::rmsnorm_backward(dinp, dout, inp, rstd, N, C);
}

}  // namespace core
