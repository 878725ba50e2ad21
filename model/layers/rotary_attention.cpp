#include "model/layers/rotary_attention.h"

#include <string>

namespace model {

RotaryAttention::RotaryAttention(Context& ctx, int block, const AttentionMasks& masks,
                                 ValueEmbeddings* tables, BranchWiring branch)
    : Attention(ctx, block, masks, branch),
      tables_(tables),
      table_(ctx.config.value_embed_of(block)),
      v_lambdas_(ctx.params.find("blocks." + std::to_string(block) + ".attn.v_lambdas")),
      aux_v_(branch.aux_v) {
  if (v_lambdas_ == kNoParam) table_ = -1;
  if (ctx.config.key_offset && !short_window_ && !paired_) key_offset_.emplace();
}

void RotaryAttention::plan_heads(ActivationPlan& plan, const Context& ctx) {
  const int64_t N = ctx.N(), D = ctx.config.d_model, H = ctx.config.n_head;
  q_ = plan.f32(N * D);
  k_ = plan.f32(N * D);
  v_ = plan.f32(N * D);
  q_rstd_ = plan.f32(N * H);
  k_rstd_ = plan.f32(N * H);
  qr_ = plan.f32(N * D);
  kr_ = plan.f32(N * D);
  vmix_ = v_lambdas_ != kNoParam ? plan.f32(N * D) : nullptr;
  vaux_ = aux_v_ ? plan.f32(N * D) : nullptr;
  aux_rows_ = aux_v_ ? plan.shared("attn.aux_rows", N * D) : nullptr;
  if (key_offset_) key_offset_->plan(plan, ctx);
  dq_ = plan.shared("attn.dq", N * D);
  dk_ = plan.shared("attn.dk", N * D);
  dv_ = plan.shared("attn.dv", N * D);
  if (!paired_) return;
  qp_ = plan.f32(N * D);
  kp_ = plan.f32(N * D);
  vp_ = plan.f32(N * D);
  dqp_ = plan.shared("attn.paired.dq", N * D);
  dkp_ = plan.shared("attn.paired.dk", N * D);
  dvp_ = plan.shared("attn.paired.dv", N * D);
}

core::AttentionLayout RotaryAttention::layout(const Context& ctx) const {
  using L = core::AttentionLayout;
  const int64_t T = ctx.T, D = ctx.config.d_model, H = ctx.config.n_head,
                hd = ctx.config.head_dim();
  if (paired_) {
    // [B, T, H hd] as [B, 2T, H / 2, hd]: slot s of position p at b T D + p D / 2 + s hd.
    const core::HeadStrides view = {T * D, hd, D / 2};
    return {H / 2, view, view, view, view};
  }
  const core::HeadStrides in = L::packed_heads(H, T, hd);
  return {H, in, in, in, L::token_rows(T, hd, D)};
}

core::RotaryVariant RotaryAttention::rotary_variant() const {
  return {masks_.rotary_frequencies(), paired_};
}

Attention::Heads RotaryAttention::heads_forward(Context& ctx) {
  const ModelConfig& c = ctx.config;
  const int64_t N = ctx.N(), D = c.d_model;
  ctx.backend.qk_norm_rotary_forward(qr_, kr_, q_, k_, v_, q_rstd_, k_rstd_, qkv_, ctx.B, ctx.T,
                                     c.n_head, c.head_dim(), c.norm_eps, c.rotary_base,
                                     c.rotary_truncate, rotary_variant());
  const float* k = key_offset_ ? key_offset_->forward(ctx, kr_) : kr_;
  const float* v = v_;
  if (vmix_) {
    const float* lam = ctx.params.value(v_lambdas_);
    ctx.backend.scalar_mix(vmix_, lam, v_, lam + 1, table_ >= 0 ? tables_->heads(table_) : nullptr,
                           N * D);
    v = vmix_;
  }
  if (aux_v_) {
    // v + the tap's rows [B, T, H hd] in the heads' layout [B, H, T, hd].
    const Stream aux = aux_v_->stream();
    const float* rows = aux.f32;
    if (aux.bf16) {
      ctx.backend.bf16_to_f32(aux_rows_, aux.bf16, N * D);
      rows = aux_rows_;
    }
    ctx.backend.copy(vaux_, v, N * D * sizeof(float));
    ctx.backend.merge_heads_backward(vaux_, rows, ctx.B, ctx.T, c.n_head, c.head_dim());
    v = vaux_;
  }
  if (!paired_) return {qr_, k, v};
  // The paired view: the heads merged into token rows.
  ctx.backend.merge_heads(qp_, qr_, ctx.B, ctx.T, c.n_head, c.head_dim());
  ctx.backend.merge_heads(kp_, k, ctx.B, ctx.T, c.n_head, c.head_dim());
  ctx.backend.merge_heads(vp_, v, ctx.B, ctx.T, c.n_head, c.head_dim());
  return {qp_, kp_, vp_};
}

Operand RotaryAttention::heads_backward(Context& ctx) {
  const ModelConfig& c = ctx.config;
  const int64_t N = ctx.N(), D = c.d_model;
  if (paired_) {
    // d of the paired view's token rows, back to the heads [B, H, T, hd] (an add into zeros).
    attention_backward(ctx, dqp_, dkp_, dvp_);
    float* d[3] = {dq_, dk_, dv_};
    const float* dp[3] = {dqp_, dkp_, dvp_};
    for (int i = 0; i < 3; ++i) {
      ctx.backend.fill_zero(d[i], N * D * sizeof(float));
      ctx.backend.merge_heads_backward(d[i], dp[i], ctx.B, ctx.T, c.n_head, c.head_dim());
    }
  } else {
    attention_backward(ctx, dq_, dk_, dv_);
  }
  if (aux_v_) {
    // d (the tap's rows) = d v in the rows' layout.
    ctx.backend.merge_heads(aux_rows_, dv_, ctx.B, ctx.T, c.n_head, c.head_dim());
    ctx.backend.add(aux_v_->grad(), aux_v_->grad(), aux_rows_, N * D);
  }
  const float* dv = dv_;
  if (vmix_) {
    // Through v = l0 v (+ l1 ve): d v (before the mix) into dmix.
    const float* lam = ctx.params.value(v_lambdas_);
    float* dlam = ctx.params.grad_of(v_lambdas_);
    const float* ve = table_ >= 0 ? tables_->heads(table_) : nullptr;
    float* dve = table_ >= 0 ? tables_->heads_grad(table_) : nullptr;
    ctx.backend.fill_zero(ctx.dmix, N * D * sizeof(float));
    ctx.backend.scalar_mix_backward(ctx.dmix, dve, dlam, dlam + 1, lam, v_, lam + 1, ve, dv_,
                                    N * D);
    dv = ctx.dmix;
  }
  // Through the key offset: d (the rotated keys).
  const float* dk = key_offset_ ? key_offset_->backward(ctx, dk_) : dk_;
  // Undo rotary and the QK-norm, then the heads' split, in one pass: d qkv written whole (in bf16
  // precision as bf16, straight from the heads' f32 gradients).
  if (dqkv_bf16_) {
    ctx.backend.qk_norm_rotary_backward(dqkv_bf16_, dq_, dk, dv, q_, k_, q_rstd_, k_rstd_, ctx.B,
                                        ctx.T, c.n_head, c.head_dim(), c.rotary_base,
                                        c.rotary_truncate, rotary_variant());
  } else {
    ctx.backend.qk_norm_rotary_backward(dqkv_, dq_, dk, dv, q_, k_, q_rstd_, k_rstd_, ctx.B, ctx.T,
                                        c.n_head, c.head_dim(), c.rotary_base, c.rotary_truncate,
                                        rotary_variant());
  }
  return {dqkv_, dqkv_bf16_};
}

}  // namespace model
