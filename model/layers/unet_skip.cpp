#include "model/layers/unet_skip.h"

#include <utility>

namespace model {

SkipAdd::SkipAdd(Context& ctx, int i, const StreamTap& source)
    : weights_(ctx.params.index("skip_weights")), i_(i), source_(source) {}

void SkipAdd::plan(ActivationPlan& plan, const Context& ctx) {
  out_ = plan.stream(ctx.N() * ctx.config.d_model);
}

Stream SkipAdd::forward(Context& ctx, Stream x) {
  in_ = x;
  // x + w_i (output of the mirrored block)
  mix_stream(ctx.backend, out_, nullptr, x, ctx.params.value(weights_) + i_, source_.stream(),
             ctx.N() * ctx.config.d_model);
  return out_;
}

void SkipAdd::backward(Context& ctx) {
  const int64_t n = ctx.N() * ctx.config.d_model;
  const float* w = ctx.params.value(weights_) + i_;
  float* dw = ctx.params.grad_of(weights_) + i_;
  ctx.backend.fill_zero(ctx.dmix, n * sizeof(float));
  mix_stream_backward(ctx.backend, ctx.dmix, source_.grad(), nullptr, dw, nullptr, in_, w,
                      source_.stream(), ctx.dres, n);
  std::swap(ctx.dmix, ctx.dres);
}

}  // namespace model
