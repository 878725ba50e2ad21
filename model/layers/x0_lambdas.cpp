#include "model/layers/x0_lambdas.h"

#include <string>
#include <utility>

namespace model {

X0Lambdas::X0Lambdas(Context& ctx, int block, const StreamTap& x0)
    : lambdas_(ctx.params.index("blocks." + std::to_string(block) + ".lambdas")), x0_(x0) {}

void X0Lambdas::plan(ActivationPlan& plan, const Context& ctx) {
  out_ = plan.stream(ctx.N() * ctx.config.d_model);
}

Stream X0Lambdas::forward(Context& ctx, Stream x) {
  in_ = x;
  const float* lam = ctx.params.value(lambdas_);
  mix_stream(ctx.backend, out_, lam, x, lam + 1, x0_.stream(), ctx.N() * ctx.config.d_model);
  return out_;
}

void X0Lambdas::backward(Context& ctx) {
  const int64_t n = ctx.N() * ctx.config.d_model;
  const float* lam = ctx.params.value(lambdas_);
  float* dlam = ctx.params.grad_of(lambdas_);
  // d input into dmix, which becomes dres; d x0 added to the source's sum.
  ctx.backend.fill_zero(ctx.dmix, n * sizeof(float));
  mix_stream_backward(ctx.backend, ctx.dmix, x0_.grad(), dlam, dlam + 1, lam, in_, lam + 1,
                      x0_.stream(), ctx.dres, n);
  std::swap(ctx.dmix, ctx.dres);
}

}  // namespace model
