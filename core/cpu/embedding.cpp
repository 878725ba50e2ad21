// The CPU backend's embedding family (core/ops/embedding.h). Token and position embeddings, forward
// and backward (embedding_kernels.h).
#include "core/cpu/cpu_backend.h"
#include "core/cpu/embedding_kernels.h"

namespace core {

void CpuBackend::embedding_forward(float* out, const int32_t* tokens, const float* wte,
                                   const float* wpe, int64_t B, int64_t T, int64_t D) {
  cpu::embedding_forward(out, tokens, wte, wpe, B, T, D);
}

void CpuBackend::embedding_forward(bf16* out, const int32_t* tokens, const float* wte,
                                   const float* wpe, int64_t B, int64_t T, int64_t D) {
  cpu::embedding_forward(out, tokens, wte, wpe, B, T, D);
}

void CpuBackend::embedding_backward(float* dwte, float* dwpe, const float* dout,
                                    const int32_t* tokens, int64_t B, int64_t T, int64_t D) {
  cpu::embedding_backward(dwte, dwpe, dout, tokens, B, T, D);
}

}  // namespace core
