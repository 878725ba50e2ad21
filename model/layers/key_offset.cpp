#include "model/layers/key_offset.h"

namespace model {

void KeyOffset::plan(ActivationPlan& plan, const Context& ctx) {
  const int64_t N = ctx.N(), D = ctx.config.d_model;
  shifted_ = plan.f32(N * D);
  dkr_ = plan.shared("attn.key_offset.dk", N * D);
}

const float* KeyOffset::forward(Context& ctx, const float* kr) {
  const ModelConfig& c = ctx.config;
  ctx.backend.key_offset_forward(shifted_, kr, int64_t(ctx.B) * c.n_head, ctx.T, c.head_dim());
  return shifted_;
}

const float* KeyOffset::backward(Context& ctx, const float* dk) {
  const ModelConfig& c = ctx.config;
  ctx.backend.key_offset_backward(dkr_, dk, int64_t(ctx.B) * c.n_head, ctx.T, c.head_dim());
  return dkr_;
}

}  // namespace model
