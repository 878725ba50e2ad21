// Op family: The classifier: fused softmax cross-entropy over padded logits, and the loss sums.
// A part of the Backend interface (core/backend.h: the conventions for pointers, shapes and
// accumulation); implemented per device in core/cpu/classifier.cpp and core/cuda/classifier.cu.
#pragma once

#include <cstdint>

#include "core/device.h"
#include "core/kernel_math.h"

namespace core {

class ClassifierOps {
 public:
  virtual ~ClassifierOps() = default;

  // Fused softmax cross-entropy over the first V of Vp columns, with optional logit soft-cap
  // z' = softcap * tanh(z / softcap) (softcap <= 0: off). losses[N] gets each row's loss: with
  // `terms` the weighted sum of its terms (kmath::LossTerms: record #89's multi-token and prefix
  // targets; terms.prefix_of is a device array), else lse - z'[target]. Every target (and every
  // prefix a present term reads) must be in [0, V).
  // When dlogits is not null it is OVERWRITTEN (not accumulated) with dloss_scale * d loss_row /
  // d logits (the chain through the soft-cap included) and zeros in the padded columns; dlogits
  // may alias logits. dloss_scale is 1/N for a mean loss.
  virtual void cross_entropy(float* losses, float* dlogits, const float* logits,
                             const int32_t* targets, int64_t N, int64_t V, int64_t Vp,
                             float softcap, float dloss_scale, const kmath::LossTerms& terms) = 0;
  // bf16 precision's form: the same math on bf16 logits (the head's GEMM writes them so; each
  // widened exactly, the soft-cap, softmax and loss in f32, losses f32), with d logits rounded
  // once to bf16 (kmath::bf16_from_float) as they are written. dlogits may alias logits (the
  // model writes the gradient over the logits) or be null (the losses only). On the same
  // values this equals the f32 op with its d logits rounded, up to the order of the f32 sums.
  virtual void cross_entropy(float* losses, bf16* dlogits, const bf16* logits,
                             const int32_t* targets, int64_t N, int64_t V, int64_t Vp,
                             float softcap, float dloss_scale, const kmath::LossTerms& terms) = 0;
  // The plain cross-entropy (one target a row, weight 1).
  void cross_entropy(float* losses, float* dlogits, const float* logits, const int32_t* targets,
                     int64_t N, int64_t V, int64_t Vp, float softcap, float dloss_scale) {
    cross_entropy(losses, dlogits, logits, targets, N, V, Vp, softcap, dloss_scale,
                  kmath::LossTerms{});
  }
  void cross_entropy(float* losses, bf16* dlogits, const bf16* logits, const int32_t* targets,
                     int64_t N, int64_t V, int64_t Vp, float softcap, float dloss_scale) {
    cross_entropy(losses, dlogits, logits, targets, N, V, Vp, softcap, dloss_scale,
                  kmath::LossTerms{});
  }
  // mean[0] = float(sum_i losses[i] / n) with the sum in float64: in index order on the CPU, in a
  // fixed tree order on CUDA (deterministic, equal to the CPU up to float64 rounding).
  virtual void mean_loss(float* mean, const float* losses, int64_t n) = 0;
  // acc[0] += double(terms[0] + ... + terms[k - 1]), the terms added in float in order: one
  // micro-step's objective (cross-entropy + auxiliary loss) into the step's float64 loss sum,
  // which stays on the device until the step reads it once.
  virtual void accumulate_loss(double* acc, const float* terms, int64_t k) = 0;
};

}  // namespace core
