#include "model/layers/smear.h"

namespace model {

Smear::Smear(Context& ctx)
    : gate_(ctx.params.index("smear_gate")), lambda_(ctx.params.index("smear_lambda")) {}

void Smear::plan(ActivationPlan& plan, const Context& ctx) {
  sigmoid_ = plan.f32(ctx.N());
}

void Smear::forward(Context& ctx, float* out, const float* x) {
  x_ = x;
  ctx.backend.smear_forward(out, sigmoid_, x, ctx.params.value(gate_), ctx.params.value(lambda_),
                            ctx.B, ctx.T, ctx.config.d_model, kSmearGateWidth);
}

void Smear::backward(Context& ctx, float* dx, const float* dout) {
  ctx.backend.smear_backward(dx, ctx.params.grad_of(gate_), ctx.params.grad_of(lambda_), x_,
                             ctx.params.value(gate_), ctx.params.value(lambda_), sigmoid_, dout,
                             ctx.B, ctx.T, ctx.config.d_model, kSmearGateWidth);
}

}  // namespace model
