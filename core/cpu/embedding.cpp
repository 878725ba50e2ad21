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

void CpuBackend::bigram_hash(int32_t* ids, const int32_t* tokens, int64_t B, int64_t T,
                             int64_t table_rows) {
  cpu::bigram_hash(ids, tokens, B, T, table_rows);
}

void CpuBackend::bigram_signs(float* x, const int32_t* tokens, const float* signs, int64_t B,
                              int64_t T, int64_t D, int64_t sign_rows) {
  cpu::bigram_signs(x, tokens, signs, B, T, D, sign_rows);
}

void CpuBackend::smear_forward(float* out, float* gate, const float* x, const float* w,
                               const float* lambda, int64_t B, int64_t T, int64_t D, int64_t K) {
  cpu::smear_forward(out, gate, x, w, lambda, B, T, D, K);
}

void CpuBackend::smear_backward(float* dx, float* dw, float* dlambda, const float* x,
                                const float* w, const float* lambda, const float* gate,
                                const float* dout, int64_t B, int64_t T, int64_t D, int64_t K) {
  cpu::smear_backward(dx, dw, dlambda, x, w, lambda, gate, dout, B, T, D, K);
}

}  // namespace core
