// model.head_fp8: the record's lm_head in FP8 in training (train_gpt.py's mm_op and
// mm_backward_op): z = (x_s w_s) Xq Wq^T with Xq = e4m3(lnf / x_s), Wq = e4m3(W / w_s); the
// backward rounds g = e5m2(dz / grad_s) and takes d lnf = (grad_s w_s) g Wq,
// dW += (grad_s x_s) g^T Xq: the record's straight-through rule (the roundings pass gradients
// unchanged, the GEMMs see the rounded operands). The scales, in units of 1/448
// (model.head_fp8_x_scale, _w_scale, _grad_scale): by default x_s = sqrt(D) / 448 (a normed row
// never saturates), w_s = 24 / 448, grad_s = 1 / 448; record #89's 100, 1.6 and 0.75 (its
// grad_s = grad_scale 0.75 / 448 divides grad_scale times the token gradient: the same codes).
// dz is the gradient of the record's loss, the SUM of the rank's token losses (train_gpt.py:503,
// reduction='sum' in training): each token's own d loss / dz, whatever the batch, which grad_s
// is scaled for. The model's objective is the mean, so the 1/N goes into the GEMMs' alphas after
// the rounding (rounding the mean's gradient instead would put every code 2^log2(N) lower, and
// flush the push-down on all but the likeliest tokens). Xq, Wq and g are stored as FP8 bytes
// (fp8_encode) and multiplied by the backend's gemm_fp8 (cuBLASLt's FP8 kernels on sm_89+; the
// CPU decodes them exactly and runs its f32 GEMM). Evaluation runs the f32 head (the logits stay
// f32 in every precision).
#pragma once

#include "model/layers/lm_head.h"

namespace model {

class Fp8Head : public LmHead {
 public:
  explicit Fp8Head(Context& ctx) : LmHead(ctx) {}
  void plan(ActivationPlan& plan, const Context& ctx) override;

  struct Scales {
    float x, w, grad;
  };
  static Scales scales(const ModelConfig& config);

 protected:
  bool bf16_logits(const Context& /*ctx*/) const override { return false; }
  void logits_forward(Context& ctx, float gain) override;
  // Training: the token losses' own gradient (the sum's), gain; evaluation: the mean's.
  float dlogits_scale(const Context& ctx, float gain) const override;
  void logits_backward(Context& ctx) override;

 private:
  // The GEMM operands as FP8 bytes: e4m3 lnf and W, e5m2 d logits.
  core::fp8 *xq_ = nullptr, *wq_ = nullptr, *gq_ = nullptr;
};

}  // namespace model
