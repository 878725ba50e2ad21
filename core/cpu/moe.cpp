// The CPU backend's moe family (core/ops/moe.h). MoE routing and the row gather/scatter of its
// dispatch (moe_kernels.h).
#include "core/cpu/cpu_backend.h"
#include "core/cpu/moe_kernels.h"

namespace core {

void CpuBackend::gather_rows(float* out, const float* src, const int32_t* index,
                             const float* weight, int64_t n, int64_t D) {
  cpu::gather_rows(out, src, index, weight, n, D);
}

void CpuBackend::scatter_add_rows(float* dst, const float* src, const int32_t* index,
                                  const float* weight, int64_t n, int64_t D) {
  cpu::scatter_add_rows(dst, src, index, weight, n, D);
}

void CpuBackend::combine_rows(bf16* out, const bf16* base, const float* rows,
                              const int32_t* slot_row, const float* gate, int64_t N, int64_t K,
                              int64_t D) {
  cpu::combine_rows(out, base, rows, slot_row, gate, N, K, D);
}

void CpuBackend::row_dot(float* out, const float* a, const float* b, int64_t n, int64_t D) {
  cpu::row_dot(out, a, b, n, D);
}

void CpuBackend::moe_route(const MoeRouting& r, float* aux_loss, const float* probs, int64_t N,
                           int64_t E, int64_t K, float aux_weight) {
  cpu::moe_route(r, aux_loss, probs, N, E, K, aux_weight);
}

void CpuBackend::moe_router_backward(float* dprobs, const MoeRouting& r, const float* dgate,
                                     int64_t N, int64_t E, int64_t K, float aux_weight) {
  cpu::moe_router_backward(dprobs, r, dgate, N, E, K, aux_weight);
}

void CpuBackend::gather_rows(bf16* out, const bf16* src, const int32_t* index, int64_t n,
                             int64_t D) {
  cpu::gather_rows(out, src, index, n, D);
}

}  // namespace core
