// The CPU backend's classifier family (core/ops/classifier.h). The fused softmax cross-entropy on
// f32 or bf16 logits and the loss reductions (classifier_kernels.h).
#include "core/cpu/classifier_kernels.h"
#include "core/cpu/cpu_backend.h"

namespace core {

void CpuBackend::cross_entropy(float* losses, float* dlogits, const float* logits,
                               const int32_t* targets, int64_t N, int64_t V, int64_t Vp,
                               float softcap, float dloss_scale, const kmath::LossTerms& terms) {
  cpu::cross_entropy(losses, dlogits, logits, targets, N, V, Vp, softcap, dloss_scale, terms);
}

void CpuBackend::cross_entropy(float* losses, bf16* dlogits, const bf16* logits,
                               const int32_t* targets, int64_t N, int64_t V, int64_t Vp,
                               float softcap, float dloss_scale, const kmath::LossTerms& terms) {
  cpu::cross_entropy(losses, dlogits, logits, targets, N, V, Vp, softcap, dloss_scale, terms);
}

void CpuBackend::mean_loss(float* mean, const float* losses, int64_t n) {
  cpu::mean_loss(mean, losses, n);
}

void CpuBackend::accumulate_loss(double* acc, const float* terms, int64_t k) {
  cpu::accumulate_loss(acc, terms, k);
}

}  // namespace core
