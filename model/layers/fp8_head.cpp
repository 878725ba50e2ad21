#include "model/layers/fp8_head.h"

#include <cmath>

#include "core/kernel_math.h"

namespace model {

Fp8Head::Scales Fp8Head::scales(const ModelConfig& config) {
  const float x = config.head_fp8_x_scale > 0.0f ? config.head_fp8_x_scale
                                                 : std::sqrt(static_cast<float>(config.d_model));
  return {x / 448.0f, config.head_fp8_w_scale / 448.0f, config.head_fp8_grad_scale / 448.0f};
}

void Fp8Head::plan(ActivationPlan& plan, const Context& ctx) {
  const int64_t N = ctx.N(), D = ctx.config.d_model, Vp = ctx.config.padded_vocab();
  xq_ = plan.fp8(N * D);
  wq_ = plan.fp8(Vp * D);
  gq_ = plan.fp8(N * Vp);
  LmHead::plan(plan, ctx);
}

float Fp8Head::dlogits_scale(const Context& ctx, float gain) const {
  return ctx.want_grad ? gain : LmHead::dlogits_scale(ctx, gain);
}

void Fp8Head::logits_forward(Context& ctx, float gain) {
  if (!ctx.want_grad) {
    LmHead::logits_forward(ctx, gain);  // the record's head in training only
    return;
  }
  const int64_t N = ctx.N(), D = ctx.config.d_model, Vp = ctx.config.padded_vocab();
  const Scales s = scales(ctx.config);
  using core::kmath::Fp8;
  // In bf16 precision the final norm is stored only in bf16 (as the record's activations are):
  // its widened values are what the record scales and rounds.
  const Operand lnf = norm_.out();
  if (lnf.f32) {
    ctx.backend.fp8_encode(xq_, lnf.f32, N * D, s.x, Fp8::E4M3);
  } else {
    ctx.backend.fp8_encode(xq_, lnf.bf16, N * D, s.x, Fp8::E4M3);
  }
  ctx.backend.fp8_encode(wq_, ctx.params.value(head_), Vp * D, s.w, Fp8::E4M3);
  core::GemmArgs a;  // the record's forward _scaled_mm: use_fast_accum=True
  a.trans_b = true;
  a.m = N, a.n = Vp, a.k = D, a.alpha = gain * s.x * s.w;
  a.fp8_fast_accum = true;
  ctx.backend.gemm_fp8(a, xq_, Fp8::E4M3, wq_, Fp8::E4M3, logits_);
}

void Fp8Head::logits_backward(Context& ctx) {
  const int64_t N = ctx.N(), D = ctx.config.d_model, Vp = ctx.config.padded_vocab();
  const Scales s = scales(ctx.config);
  using core::kmath::Fp8;
  // logits_ holds d (sum of the token losses) / d z; g = e5m2(dz / grad_s). The backward GEMMs
  // accumulate exactly (the record's use_fast_accum=False) and take the mean's 1 / N.
  ctx.backend.fp8_encode(gq_, logits_, N * Vp, s.grad, Fp8::E5M2);
  const float mean = 1.0f / static_cast<float>(N);
  core::GemmArgs a;  // d lnf = (grad_s w_s / N) g Wq
  a.m = N, a.n = D, a.k = Vp, a.alpha = s.grad * s.w * mean;
  core::GemmArgs b;  // d W += (grad_s x_s / N) g^T Xq
  b.trans_a = true;
  b.m = Vp, b.n = D, b.k = N, b.beta = 1.0f, b.alpha = s.grad * s.x * mean;
  ctx.backend.gemm_fp8(a, gq_, Fp8::E5M2, wq_, Fp8::E4M3, ctx.dln);
  ctx.backend.gemm_fp8(b, gq_, Fp8::E5M2, xq_, Fp8::E4M3, ctx.params.grad_of(head_));
}

}  // namespace model
