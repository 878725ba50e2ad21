#include "model/layers/weight_lambda.h"

#include <utility>

namespace model {

WeightLambda::WeightLambda(Context& ctx, size_t weight, size_t lambdas, int element,
                           std::string scratch)
    : weight_(weight),
      lambdas_(lambdas),
      element_(element),
      scratch_(std::move(scratch)),
      numel_(ctx.params.table()[weight].numel) {}

void WeightLambda::plan(ActivationPlan& plan, const Context& /*ctx*/) {
  scaled_ = plan.shared(scratch_ + ".scaled", numel_);
  scaled_bf16_ = plan.shared_bf16(scratch_ + ".scaled_bf16", numel_);
  grad_ = plan.shared(scratch_ + ".grad", numel_);
}

Operand WeightLambda::scaled(Context& ctx) {
  const float* lam = ctx.params.value(lambdas_) + element_;
  ctx.backend.scalar_mix(scaled_, lam, ctx.params.value(weight_), nullptr, nullptr, numel_);
  if (scaled_bf16_) ctx.backend.f32_to_bf16(scaled_bf16_, scaled_, numel_);
  return {scaled_, scaled_bf16_};
}

float* WeightLambda::begin_grad(Context& ctx) {
  ctx.backend.fill_zero(grad_, numel_ * sizeof(float));
  return grad_;
}

void WeightLambda::end_grad(Context& ctx) {
  ctx.backend.scalar_mix_backward(ctx.params.grad_of(weight_), nullptr,
                                  ctx.params.grad_of(lambdas_) + element_, nullptr,
                                  ctx.params.value(lambdas_) + element_, ctx.params.value(weight_),
                                  nullptr, nullptr, grad_, numel_);
}

}  // namespace model
