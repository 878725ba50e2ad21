#include "model/layers/value_embeddings.h"

#include <string>

namespace model {

ValueEmbeddings::ValueEmbeddings(Context& ctx) {
  for (int i = 0; i < ctx.config.value_embeds; ++i)
    tables_.push_back(ctx.params.index("value_embeds." + std::to_string(i) + ".weight"));
}

void ValueEmbeddings::plan(ActivationPlan& plan, const Context& ctx) {
  const int64_t N = ctx.N(), D = ctx.config.d_model;
  heads_.clear();
  dheads_.clear();
  for (size_t i = 0; i < tables_.size(); ++i) {
    heads_.push_back(plan.f32(N * D));
    dheads_.push_back(plan.f32(N * D));
  }
  rows_ = plan.f32(N * D);
}

Stream ValueEmbeddings::forward(Context& ctx, Stream x) {
  core::Backend& be = ctx.backend;
  const int64_t N = ctx.N(), D = ctx.config.d_model, H = ctx.config.n_head,
                hd = ctx.config.head_dim();
  for (size_t i = 0; i < tables_.size(); ++i) {
    be.embedding_forward(rows_, ctx.tokens, ctx.params.value(tables_[i]), nullptr, ctx.B, ctx.T, D);
    be.fill_zero(heads_[i], N * D * sizeof(float));
    be.merge_heads_backward(heads_[i], rows_, ctx.B, ctx.T, H, hd);
  }
  return x;
}

void ValueEmbeddings::begin_backward(Context& ctx) {
  for (float* d : dheads_)
    ctx.backend.fill_zero(d, ctx.N() * ctx.config.d_model * sizeof(float));
}

void ValueEmbeddings::backward(Context& ctx) {
  const int64_t D = ctx.config.d_model;
  for (size_t i = 0; i < tables_.size(); ++i) {
    ctx.backend.merge_heads(rows_, dheads_[i], ctx.B, ctx.T, ctx.config.n_head,
                            ctx.config.head_dim());
    ctx.backend.embedding_backward(ctx.params.grad_of(tables_[i]), nullptr, rows_, ctx.tokens,
                                   ctx.B, ctx.T, D);
  }
}

}  // namespace model
