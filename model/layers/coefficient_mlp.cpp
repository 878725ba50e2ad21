#include "model/layers/coefficient_mlp.h"

namespace model {

CoefficientMlp::CoefficientMlp(Context& ctx, const std::string& prefix, float scale,
                               const std::string& scale_param)
    : w1_(ctx.params.index(prefix + ".w1")),
      w2_(ctx.params.index(prefix + ".w2")),
      b2_(ctx.params.index(prefix + ".b2")),
      scale_param_(scale_param.empty() ? kNoParam : ctx.params.index(scale_param)),
      scale_(scale),
      K_(ctx.params.table()[w2_].shape.at(0)) {
  ctx.params.use_in_bf16_gemm(w1_);
}

void CoefficientMlp::plan(ActivationPlan& plan, const Context& ctx) {
  const int64_t N = ctx.N();
  pre_ = plan.f32(N * kHidden);
  act_ = plan.f32(N * kHidden);
  zb_ = plan.f32(N * K_);
  coefs_ = plan.f32(N * K_);
  dcoefs_ = plan.f32(N * K_);
  dzb_ = plan.shared("mudd.dzb", N * K_);
  dact_ = plan.shared("mudd.dact", N * kHidden);
  dpre_ = plan.shared("mudd.dpre", N * kHidden);
}

Stream CoefficientMlp::forward(Context& ctx, Stream x) {
  const int64_t N = ctx.N(), D = ctx.config.d_model;
  core::Backend& be = ctx.backend;
  in_ = x;
  ctx.linear.forward(pre_, {x.f32, x.bf16}, ctx.params.weight(w1_), N, D, kHidden);
  be.gelu_erf_forward(act_, pre_, N * kHidden);
  ctx.linear.forward_epilogue(zb_, {act_, nullptr}, ctx.params.weight(w2_), ctx.params.value(b2_),
                              N, kHidden, K_);
  if (scale_param_ != kNoParam) {
    be.scalar_mix(coefs_, ctx.params.value(scale_param_), zb_, nullptr, nullptr, N * K_);
  } else {
    be.copy(coefs_, zb_, N * K_ * sizeof(float));
    be.scale(coefs_, scale_, N * K_);
  }
  return x;
}

void CoefficientMlp::begin_backward(Context& ctx) {
  ctx.backend.fill_zero(dcoefs_, ctx.N() * K_ * sizeof(float));
}

void CoefficientMlp::backward(Context& ctx) {
  const int64_t N = ctx.N(), D = ctx.config.d_model;
  core::Backend& be = ctx.backend;
  // c = s zb: d zb = s d c (and d s = <zb, d c> for the learned scale).
  be.fill_zero(dzb_, N * K_ * sizeof(float));
  if (scale_param_ != kNoParam) {
    be.scalar_mix_backward(dzb_, nullptr, ctx.params.grad_of(scale_param_), nullptr,
                           ctx.params.value(scale_param_), zb_, nullptr, nullptr, dcoefs_, N * K_);
  } else {
    be.add_scaled(dzb_, scale_, dcoefs_, N * K_);
  }
  // zb = act W2^T + b: d act, d W2, d b.
  ctx.linear.backward(dact_, ctx.params.grad_of(w2_), dzb_, {act_, nullptr}, ctx.params.weight(w2_),
                      N, kHidden, K_, 0.0f, nullptr, ctx.params.grad_of(b2_));
  be.fill_zero(dpre_, N * kHidden * sizeof(float));
  be.gelu_erf_backward(dpre_, pre_, dact_, N * kHidden);
  // pre = x W1^T: d W1, and d x added to the stream's gradient.
  ctx.linear.backward(ctx.dres, ctx.params.grad_of(w1_), dpre_, {in_.f32, in_.bf16},
                      ctx.params.weight(w1_), N, D, kHidden, 1.0f);
}

}  // namespace model
