#include "model/layers/attention.h"

#include <string>

namespace model {

namespace {

size_t block_param(const Context& ctx, int block, const char* name) {
  return ctx.params.find("blocks." + std::to_string(block) + "." + name);
}

}  // namespace

Attention::Attention(Context& ctx, int block, const AttentionMasks& masks, ValueEmbeddings* tables)
    : modern_(ctx.config.arch == Arch::Modern),
      short_window_(ctx.config.short_window(block)),
      masks_(masks),
      tables_(tables),
      table_(ctx.config.value_embed_of(block)),
      norm_(ctx.config, block_param(ctx, block, "ln1.weight"), block_param(ctx, block, "ln1.bias")),
      qkv_w_(ctx.params.index("blocks." + std::to_string(block) + ".attn.qkv.weight")),
      qkv_b_(block_param(ctx, block, "attn.qkv.bias")),
      proj_w_(ctx.params.index("blocks." + std::to_string(block) + ".attn.proj.weight")),
      proj_b_(block_param(ctx, block, "attn.proj.bias")),
      v_lambdas_(block_param(ctx, block, "attn.v_lambdas")) {
  ctx.params.use_in_bf16_gemm(qkv_w_);
  ctx.params.use_in_bf16_gemm(proj_w_);
  if (!ctx.config.has_v_lambdas(block)) table_ = -1;
}

void Attention::plan(ActivationPlan& plan, const Context& ctx) {
  const int64_t N = ctx.N(), D = ctx.config.d_model, H = ctx.config.n_head;
  norm_.plan(plan, ctx);
  qkv_ = plan.f32(N * 3 * D);
  if (modern_) {
    q_ = plan.f32(N * D);
    k_ = plan.f32(N * D);
    v_ = plan.f32(N * D);
    q_rstd_ = plan.f32(N * H);
    k_rstd_ = plan.f32(N * H);
    qr_ = plan.f32(N * D);
    kr_ = plan.f32(N * D);
  }
  vmix_ = v_lambdas_ != kNoParam ? plan.f32(N * D) : nullptr;
  lse_ = plan.f32(N * H);
  atty_ = plan.f32_unless_bf16(N * D);
  atty_bf16_ = plan.bf16(N * D);
  out_ = plan.stream(N * D);
  // GPT-2's attention backward writes d qkv itself (in bf16 precision as bf16); the modern
  // blocks' QK-norm and rotary backward go through the heads' f32 dq, dk, dv.
  dqkv_ = plan.shared_unless_bf16("attn.dqkv", N * 3 * D);
  dqkv_bf16_ = plan.shared_bf16("attn.dqkv_bf16", N * 3 * D);
  if (modern_) {
    dq_ = plan.shared("attn.dq", N * D);
    dk_ = plan.shared("attn.dk", N * D);
    dv_ = plan.shared("attn.dv", N * D);
  }
  datty_ = plan.shared("attn.datty", N * D);
}

core::AttentionLayout Attention::layout(const Context& ctx) const {
  using L = core::AttentionLayout;
  const int64_t T = ctx.T, D = ctx.config.d_model, H = ctx.config.n_head,
                hd = ctx.config.head_dim();
  const core::HeadStrides in = modern_ ? L::packed_heads(H, T, hd) : L::token_rows(T, hd, 3 * D);
  return {H, in, in, in, L::token_rows(T, hd, D)};
}

Stream Attention::forward(Context& ctx, Stream x) {
  core::Backend& be = ctx.backend;
  const ModelConfig& c = ctx.config;
  const int64_t B = ctx.B, T = ctx.T, N = B * T, D = c.d_model, H = c.n_head, hd = c.head_dim();
  in_ = x;
  norm_.forward(ctx, x);
  ctx.linear.forward_epilogue(qkv_, norm_.out(), ctx.params.weight(qkv_w_),
                              ctx.params.value(qkv_b_), N, D, 3 * D);
  // GPT-2: q, k and v read in place from qkv, 3 D floats a token.
  const float* q = qkv_;
  const float* k = qkv_ + D;
  const float* v = qkv_ + 2 * D;
  if (modern_) {
    // The heads split, QK-norm per head over hd, then rotary on the normalised copies: one pass.
    be.qk_norm_rotary_forward(qr_, kr_, q_, k_, v_, q_rstd_, k_rstd_, qkv_, B, T, H, hd, c.norm_eps,
                              c.rotary_base, c.rotary_truncate);
    q = qr_;
    k = kr_;
    v = v_;
  }
  if (vmix_) {
    // v = l0 v + l1 ve with the block's learned pair (init 0.5, 0.5); l0 v without a table
    // (modern blocks only: the recipe's keys need arch modern, whose heads are split above).
    const float* lam = ctx.params.value(v_lambdas_);
    be.scalar_mix(vmix_, lam, v_, lam + 1, table_ >= 0 ? tables_->heads(table_) : nullptr, N * D);
    v = vmix_;
  }
  // Below fp32 a device may take attention's products to tensor cores too (TF32).
  // The output [B, T, H hd], the heads merged as written; in bf16 precision written as bf16.
  const bool tf32 = c.precision != Precision::Fp32;
  const float scale = c.attention_scale();
  const core::AttentionMask mask = masks_.mask(short_window_);
  if (atty_bf16_) {
    be.attention_forward(atty_bf16_, lse_, q, k, v, B * H, T, hd, scale, mask, tf32, layout(ctx));
  } else {
    be.attention_forward(atty_, lse_, q, k, v, B * H, T, hd, scale, mask, tf32, layout(ctx));
  }
  // res_mid = x + atty @ proj^T (+ bias): the residual add as the GEMM's C.
  ctx.linear.residual_forward(out_, {atty_, atty_bf16_}, ctx.params.weight(proj_w_),
                              ctx.params.value(proj_b_), N, D, D, x);
  return out_;
}

void Attention::backward(Context& ctx) {
  core::Backend& be = ctx.backend;
  const ModelConfig& c = ctx.config;
  const int64_t B = ctx.B, T = ctx.T, N = B * T, D = c.d_model, H = c.n_head, hd = c.head_dim();
  // dres holds d/d res_mid; the residual path passes it through unchanged.
  ctx.linear.backward(datty_, ctx.params.grad_of(proj_w_), ctx.dres, {atty_, atty_bf16_},
                      ctx.params.weight(proj_w_), N, D, D, 0.0f, nullptr,
                      ctx.params.grad_of(proj_b_));
  const core::AttentionLayout lay = layout(ctx);
  const bool tf32 = c.precision != Precision::Fp32;
  const float scale = c.attention_scale();
  const core::AttentionMask mask = masks_.mask(short_window_);
  if (!modern_) {
    // GPT-2: dq, dk, dv written (=) straight into d qkv's columns, in bf16 precision as bf16 (the
    // QKV projection's GEMMs and its bias gradient read them as written).
    const float *q = qkv_, *k = qkv_ + D, *v = qkv_ + 2 * D;
    if (dqkv_bf16_) {
      core::bf16* d = dqkv_bf16_;
      be.attention_backward(d, d + D, d + 2 * D, datty_, atty_bf16_, lse_, q, k, v, B * H, T, hd,
                            scale, mask, tf32, lay);
    } else {
      be.attention_backward(dqkv_, dqkv_ + D, dqkv_ + 2 * D, datty_, atty_, lse_, q, k, v, B * H, T,
                            hd, scale, mask, tf32, lay);
    }
    qkv_backward(ctx, {dqkv_, dqkv_bf16_});
    return;
  }
  // The modern blocks: f32 dq, dk, dv [B, H, T, hd] for the rotary and QK-norm backward, from
  // attention's output as stored.
  const float* v = vmix_ ? vmix_ : v_;
  if (atty_bf16_) {
    be.attention_backward(dq_, dk_, dv_, datty_, atty_bf16_, lse_, qr_, kr_, v, B * H, T, hd, scale,
                          mask, tf32, lay);
  } else {
    be.attention_backward(dq_, dk_, dv_, datty_, atty_, lse_, qr_, kr_, v, B * H, T, hd, scale,
                          mask, tf32, lay);
  }
  const float* dv = dv_;
  if (vmix_) {
    // Through v = l0 v (+ l1 ve): d v (before the mix) into dmix.
    const float* lam = ctx.params.value(v_lambdas_);
    float* dlam = ctx.params.grad_of(v_lambdas_);
    const float* ve = table_ >= 0 ? tables_->heads(table_) : nullptr;
    float* dve = table_ >= 0 ? tables_->heads_grad(table_) : nullptr;
    be.fill_zero(ctx.dmix, N * D * sizeof(float));
    be.scalar_mix_backward(ctx.dmix, dve, dlam, dlam + 1, lam, v_, lam + 1, ve, dv_, N * D);
    dv = ctx.dmix;
  }
  // Undo rotary and the QK-norm, then the heads' split, in one pass: d qkv written whole (in bf16
  // precision as bf16, straight from the heads' f32 gradients).
  if (dqkv_bf16_) {
    be.qk_norm_rotary_backward(dqkv_bf16_, dq_, dk_, dv, q_, k_, q_rstd_, k_rstd_, B, T, H, hd,
                               c.rotary_base, c.rotary_truncate);
  } else {
    be.qk_norm_rotary_backward(dqkv_, dq_, dk_, dv, q_, k_, q_rstd_, k_rstd_, B, T, H, hd,
                               c.rotary_base, c.rotary_truncate);
  }
  qkv_backward(ctx, {dqkv_, dqkv_bf16_});
}

void Attention::qkv_backward(Context& ctx, Operand dqkv) {
  const int64_t N = ctx.N(), D = ctx.config.d_model;
  ctx.linear.backward(ctx.dln, ctx.params.grad_of(qkv_w_), dqkv.f32, norm_.out(),
                      ctx.params.weight(qkv_w_), N, D, 3 * D, 0.0f, dqkv.bf16,
                      ctx.params.grad_of(qkv_b_));
  norm_.backward(ctx, ctx.dres, ctx.dln, in_);
}

}  // namespace model
