#include "model/layers/token_embedding.h"

#include <utility>

namespace model {

TokenEmbedding::TokenEmbedding(Context& ctx)
    : embed_(ctx.params.index("embed.weight")),
      pos_(ctx.params.find("pos_embed.weight")),
      norm_(ctx.config.x0_norm) {
  if (ctx.config.smear) smear_.emplace(ctx);
}

void TokenEmbedding::plan(ActivationPlan& plan, const Context& ctx) {
  const int64_t N = ctx.N(), D = ctx.config.d_model;
  out_ = plan.stream(N * D);
  raw_ = norm_ ? plan.f32(N * D) : nullptr;
  rstd_ = norm_ ? plan.f32(N) : nullptr;
  smeared_ = smear_ ? plan.f32(N * D) : nullptr;
  if (smear_) smear_->plan(plan, ctx);
}

Stream TokenEmbedding::forward(Context& ctx, Stream /*x*/) {
  core::Backend& be = ctx.backend;
  const int64_t N = ctx.N(), D = ctx.config.d_model;
  const float* embed = ctx.params.value(embed_);
  const float* pos = ctx.params.value(pos_);
  if (norm_) {
    be.embedding_forward(raw_, ctx.tokens, embed, pos, ctx.B, ctx.T, D);
    if (smear_) smear_->forward(ctx, smeared_, raw_);
    const float* rows = smear_ ? smeared_ : raw_;
    if (out_.bf16) {
      be.rmsnorm_forward(out_.bf16, rstd_, rows, N, D, ctx.config.norm_eps);
    } else {
      be.rmsnorm_forward(out_.f32, rstd_, rows, N, D, ctx.config.norm_eps);
    }
  } else if (out_.bf16) {
    be.embedding_forward(out_.bf16, ctx.tokens, embed, pos, ctx.B, ctx.T, D);
  } else {
    be.embedding_forward(out_.f32, ctx.tokens, embed, pos, ctx.B, ctx.T, D);
  }
  return out_;
}

void TokenEmbedding::backward(Context& ctx) {
  core::Backend& be = ctx.backend;
  const int64_t N = ctx.N(), D = ctx.config.d_model;
  if (norm_) {
    // Through x0 = rmsnorm(rows): d rows into dmix, which becomes dres.
    be.fill_zero(ctx.dmix, N * D * sizeof(float));
    be.rmsnorm_backward(ctx.dmix, ctx.dres, smear_ ? smeared_ : raw_, rstd_, N, D);
    std::swap(ctx.dmix, ctx.dres);
    if (smear_) {
      // Through the smear: d rows (written) into dmix, which becomes dres.
      smear_->backward(ctx, ctx.dmix, ctx.dres);
      std::swap(ctx.dmix, ctx.dres);
    }
  }
  be.embedding_backward(ctx.params.grad_of(embed_), ctx.params.grad_of(pos_), ctx.dres, ctx.tokens,
                        ctx.B, ctx.T, D);
}

}  // namespace model
