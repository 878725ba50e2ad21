// The CPU backend's gemm family (core/ops/gemm.h). GEMM through OpenBLAS (cpu_gemm.h), and the bias
// add and its gradient.
#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_gemm.h"
#include "core/cpu/cpu_kernels.h"

namespace core {

void CpuBackend::gemm(const GemmArgs& args, const float* a, const float* b, float* c) {
  cpu::gemm(args, a, b, c);
}

void CpuBackend::add_bias(float* out, const float* bias, int64_t N, int64_t C) {
  cpu::add_bias(out, bias, N, C);
}

void CpuBackend::bias_backward(float* dbias, const float* dout, int64_t N, int64_t C) {
  cpu::bias_backward(dbias, dout, N, C);
}

}  // namespace core
