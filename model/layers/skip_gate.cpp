#include "model/layers/skip_gate.h"

#include <utility>

namespace model {

SkipGate::SkipGate(Context& ctx, const std::string& lambda_param, CoefOf gate)
    : lambda_(ctx.params.index(lambda_param)), gate_(std::move(gate)) {}

void SkipGate::plan(ActivationPlan& plan, const Context& ctx) {
  out_ = plan.f32(ctx.N());
  dout_ = plan.f32(ctx.N());
}

Stream SkipGate::forward(Context& ctx, Stream x) {
  const CoefView g = gate_(ctx, false);
  ctx.backend.sigmoid_scale(out_, ctx.params.value(lambda_), g.values, g.stride, ctx.N());
  return x;
}

void SkipGate::begin_backward(Context& ctx) {
  ctx.backend.fill_zero(dout_, ctx.N() * sizeof(float));
}

void SkipGate::backward(Context& ctx) {
  const CoefView g = gate_(ctx, true);
  ctx.backend.sigmoid_scale_backward(g.grads, ctx.params.grad_of(lambda_),
                                     ctx.params.value(lambda_), g.values, g.stride, dout_, ctx.N());
}

}  // namespace model
