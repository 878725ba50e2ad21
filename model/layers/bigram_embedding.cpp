#include "model/layers/bigram_embedding.h"

#include <string>

#include "core/rng.h"
#include "core/transfer.h"

namespace model {

core::Tensor bigram_sign_table(int64_t D) {
  core::Tensor s = core::Tensor::empty({kBigramSignRows, D});
  float* p = s.data<float>();
  for (int64_t i = 0; i < s.numel(); ++i)
    p[i] = (core::rng_hash(kBigramSignStream, static_cast<uint64_t>(i)) >> 63) ? -1.0f : 1.0f;
  return s;
}

BigramSource::BigramSource(Context& ctx)
    : table_(ctx.params.index("bigram_embed.weight")),
      signs_(core::to_backend(ctx.backend, bigram_sign_table(ctx.config.d_model))) {}

void BigramSource::plan(ActivationPlan& plan, const Context& ctx) {
  const int64_t N = ctx.N(), D = ctx.config.d_model;
  ids_ = plan.i32(N);
  bg_ = plan.f32(N * D);
  dbg_ = plan.f32(N * D);
}

Stream BigramSource::forward(Context& ctx, Stream x) {
  core::Backend& be = ctx.backend;
  const int64_t D = ctx.config.d_model;
  be.bigram_hash(ids_, ctx.tokens, ctx.B, ctx.T, ctx.config.bigram_rows);
  be.embedding_forward(bg_, ids_, ctx.params.value(table_), nullptr, ctx.B, ctx.T, D);
  be.bigram_signs(bg_, ctx.tokens, signs_.data<float>(), ctx.B, ctx.T, D, kBigramSignRows);
  return x;
}

void BigramSource::begin_backward(Context& ctx) {
  ctx.backend.fill_zero(dbg_, ctx.N() * ctx.config.d_model * sizeof(float));
}

void BigramSource::backward(Context& ctx) {
  core::Backend& be = ctx.backend;
  const int64_t D = ctx.config.d_model;
  // The signs are their own transpose: d BG[hash[t]] += S[sign row of t] * d bg[t].
  be.bigram_signs(dbg_, ctx.tokens, signs_.data<float>(), ctx.B, ctx.T, D, kBigramSignRows);
  be.embedding_backward(ctx.params.grad_of(table_), nullptr, dbg_, ids_, ctx.B, ctx.T, D);
}

BigramInject::BigramInject(Context& ctx, int block, const BigramSource& source)
    : gate_(ctx.params.index("blocks." + std::to_string(block) + ".bigram_gate")),
      source_(source) {}

CoefView BigramInject::gate(const Context& ctx, bool backward) const {
  return {ctx.params.value(gate_), backward ? ctx.params.grad_of(gate_) : nullptr, 0};
}

void BigramInject::plan(ActivationPlan& plan, const Context& ctx) {
  out_ = plan.stream(ctx.N() * ctx.config.d_model);
}

Stream BigramInject::forward(Context& ctx, Stream x) {
  const CoefView g = gate(ctx, false);
  const int64_t N = ctx.N(), D = ctx.config.d_model;
  if (out_.bf16) {
    ctx.backend.coef_add(out_.bf16, x.bf16, g.values, g.stride, source_.bg(), N, D);
  } else {
    ctx.backend.coef_add(out_.f32, x.f32, g.values, g.stride, source_.bg(), N, D);
  }
  return out_;
}

void BigramInject::backward(Context& ctx) {
  // d x is d out itself (ctx.dres stays); d bg and d g from it.
  const CoefView g = gate(ctx, true);
  ctx.backend.coef_add_backward(source_.bg_grad(), g.grads, g.values, g.stride, source_.bg(),
                                ctx.dres, ctx.N(), ctx.config.d_model);
}

}  // namespace model
