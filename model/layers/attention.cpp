#include "model/layers/attention.h"

#include <string>

#include "core/check.h"

namespace model {

namespace {

size_t block_param(const Context& ctx, int block, const char* name) {
  return ctx.params.find("blocks." + std::to_string(block) + "." + name);
}

}  // namespace

Attention::Attention(Context& ctx, int block, const AttentionMasks& masks, BranchWiring branch)
    : block_(block),
      masks_(masks),
      branch_(branch),
      short_window_(ctx.config.short_window(block)),
      paired_(ctx.config.paired_heads(block)),
      norm_(ctx.config, block_param(ctx, block, "ln1.weight"), block_param(ctx, block, "ln1.bias")),
      qkv_w_(ctx.params.index("blocks." + std::to_string(block) + ".attn.qkv.weight")),
      qkv_b_(block_param(ctx, block, "attn.qkv.bias")),
      proj_w_(ctx.params.index("blocks." + std::to_string(block) + ".attn.proj.weight")),
      proj_b_(block_param(ctx, block, "attn.proj.bias")),
      xsa_alpha_(block_param(ctx, block, "attn.xsa_alpha")),
      out_gate_(block_param(ctx, block, "attn.out_gate")) {
  ctx.params.use_in_bf16_gemm(qkv_w_);
  ctx.params.use_in_bf16_gemm(proj_w_);
  const size_t lambdas = block_param(ctx, block, "attn.qkvo_lambdas");
  if (lambdas != kNoParam) {
    qkv_lambda_.emplace(ctx, qkv_w_, lambdas, 0, "attn.qkv_lambda");
    proj_lambda_.emplace(ctx, proj_w_, lambdas, 1, "attn.proj_lambda");
  }
  ENGINE_CHECK(!branch.alone || proj_b_ == kNoParam,
               "attention: a branch alone (block " + std::to_string(block) + ") takes no bias");
}

Operand Attention::qkv_weight(Context& ctx) {
  return qkv_lambda_ ? qkv_lambda_->scaled(ctx) : ctx.params.weight(qkv_w_);
}

Operand Attention::proj_weight(Context& ctx) {
  return proj_lambda_ ? proj_lambda_->scaled(ctx) : ctx.params.weight(proj_w_);
}

float* Attention::qkv_weight_grad(Context& ctx) {
  return qkv_lambda_ ? qkv_lambda_->begin_grad(ctx) : ctx.params.grad_of(qkv_w_);
}

float* Attention::proj_weight_grad(Context& ctx) {
  return proj_lambda_ ? proj_lambda_->begin_grad(ctx) : ctx.params.grad_of(proj_w_);
}

int64_t Attention::op_heads(const Context& ctx) const {
  return int64_t(ctx.B) * (paired_ ? ctx.config.n_head / 2 : ctx.config.n_head);
}

namespace {

// A CoefView's device side for the attention op.
core::HeadCoefs head_coefs(const CoefView& c) {
  return {c.values, c.grads, c.stride};
}

// A per-head parameter read as one coefficient row for every token (stride 0), with its gradient
// in the backward (unbound in the forward under ZeRO).
CoefView param_coefs(const Context& ctx, size_t param, bool backward) {
  if (param == kNoParam) return {};
  return {ctx.params.value(param), backward ? ctx.params.grad_of(param) : nullptr, 0};
}

}  // namespace

CoefView Attention::xsa_alpha(const Context& ctx, bool backward) const {
  return param_coefs(ctx, xsa_alpha_, backward);
}

CoefView Attention::out_gate(const Context& ctx, bool backward) const {
  return param_coefs(ctx, out_gate_, backward);
}

void Attention::plan(ActivationPlan& plan, const Context& ctx) {
  const int64_t N = ctx.N(), D = ctx.config.d_model, H = ctx.config.n_head;
  norm_.plan(plan, ctx);
  if (qkv_lambda_) qkv_lambda_->plan(plan, ctx);
  if (proj_lambda_) proj_lambda_->plan(plan, ctx);
  qkv_ = plan.f32(N * 3 * D);
  plan_heads(plan, ctx);
  lse_ = plan.f32(N * H);
  atty_ = plan.f32_unless_bf16(N * D);
  atty_bf16_ = plan.bf16(N * D);
  out_ = plan.stream(N * D);
  dqkv_ = plan.shared_unless_bf16("attn.dqkv", N * 3 * D);
  dqkv_bf16_ = plan.shared_bf16("attn.dqkv_bf16", N * 3 * D);
  datty_ = plan.shared("attn.datty", N * D);
  if (!corrected()) return;
  attz_ = plan.f32_unless_bf16(N * D);
  attz_bf16_ = plan.bf16(N * D);
  dattz_ = plan.shared("attn.dattz", N * D);
  if (xsa_alpha_ != kNoParam) dvx_ = plan.shared("attn.xsa.dv", N * D);
}

Stream Attention::forward(Context& ctx, Stream x) {
  const ModelConfig& c = ctx.config;
  const int64_t N = ctx.N(), D = c.d_model, BH = op_heads(ctx), T = op_rows(ctx), hd = c.head_dim();
  in_ = branch_.input ? branch_.input->stream() : x;
  norm_.forward(ctx, in_);
  ctx.linear.forward_epilogue(qkv_, norm_.out(), qkv_weight(ctx), ctx.params.value(qkv_b_), N, D,
                              3 * D);
  heads_ = heads_forward(ctx);
  // Below fp32 a device may take attention's products to tensor cores too (TF32).
  // The output [B, T, H hd], the heads merged as written; in bf16 precision written as bf16.
  const bool tf32 = c.precision != Precision::Fp32;
  const float scale = masks_.attention_scale();
  const core::AttentionMask mask = op_mask();
  const Heads& h = heads_;
  if (atty_bf16_) {
    ctx.backend.attention_forward(atty_bf16_, lse_, h.q, h.k, h.v, BH, T, hd, scale, mask, tf32,
                                  layout(ctx));
  } else {
    ctx.backend.attention_forward(atty_, lse_, h.q, h.k, h.v, BH, T, hd, scale, mask, tf32,
                                  layout(ctx));
  }
  if (corrected()) {
    // XSA and the output gate, per token and head, into attz.
    const core::HeadCoefs alpha = head_coefs(xsa_alpha(ctx, false)),
                          gate = head_coefs(out_gate(ctx, false));
    if (atty_bf16_) {
      ctx.backend.attention_out_forward(attz_bf16_, atty_bf16_, h.v, ctx.B, ctx.T, c.n_head, hd,
                                        alpha, gate);
    } else {
      ctx.backend.attention_out_forward(attz_, atty_, h.v, ctx.B, ctx.T, c.n_head, hd, alpha, gate);
    }
  }
  const Operand atty = projection_input();
  if (branch_.alone) {
    // y = atty @ proj^T (+ bias) by itself.
    if (out_.bf16) {
      ctx.linear.forward(out_.bf16, atty, proj_weight(ctx), N, D, D, 1.0f);
    } else {
      ctx.linear.forward_epilogue(out_.f32, atty, proj_weight(ctx), ctx.params.value(proj_b_), N, D,
                                  D);
    }
    return out_;
  }
  // res_mid = x + atty @ proj^T (+ bias): the residual add as the GEMM's C.
  ctx.linear.residual_forward(out_, atty, proj_weight(ctx), ctx.params.value(proj_b_), N, D, D, x);
  return out_;
}

void Attention::attention_backward(Context& ctx, float* dq, float* dk, float* dv) {
  const ModelConfig& c = ctx.config;
  const int64_t BH = op_heads(ctx), T = op_rows(ctx), hd = c.head_dim();
  const bool tf32 = c.precision != Precision::Fp32;
  const float scale = masks_.attention_scale();
  const core::AttentionMask mask = op_mask();
  const Heads& h = heads_;
  if (atty_bf16_) {
    ctx.backend.attention_backward(dq, dk, dv, datty_, atty_bf16_, lse_, h.q, h.k, h.v, BH, T, hd,
                                   scale, mask, tf32, layout(ctx));
  } else {
    ctx.backend.attention_backward(dq, dk, dv, datty_, atty_, lse_, h.q, h.k, h.v, BH, T, hd, scale,
                                   mask, tf32, layout(ctx));
  }
  if (dvx_) ctx.backend.add(dv, dv, dvx_, ctx.N() * c.d_model);  // XSA's part of d v
}

void Attention::attention_backward(Context& ctx, core::bf16* dq, core::bf16* dk, core::bf16* dv) {
  const ModelConfig& c = ctx.config;
  const bool tf32 = c.precision != Precision::Fp32;
  const Heads& h = heads_;
  ctx.backend.attention_backward(dq, dk, dv, datty_, atty_bf16_, lse_, h.q, h.k, h.v, op_heads(ctx),
                                 op_rows(ctx), c.head_dim(), masks_.attention_scale(), op_mask(),
                                 tf32, layout(ctx));
}

Operand Attention::projection_input() const {
  return corrected() ? Operand{attz_, attz_bf16_} : Operand{atty_, atty_bf16_};
}

void Attention::backward(Context& ctx) {
  const int64_t N = ctx.N(), D = ctx.config.d_model;
  // dres holds d/d res_mid; the residual path passes it through unchanged (alone: d y).
  ctx.linear.backward(corrected() ? dattz_ : datty_, proj_weight_grad(ctx), ctx.dres,
                      projection_input(), proj_weight(ctx), N, D, D, 0.0f, nullptr,
                      ctx.params.grad_of(proj_b_));
  if (proj_lambda_) proj_lambda_->end_grad(ctx);
  if (corrected()) {
    // Through XSA and the gate: d atty, XSA's d v (added in attention_backward), d alpha, d gate.
    const ModelConfig& c = ctx.config;
    const core::HeadCoefs alpha = head_coefs(xsa_alpha(ctx, true)),
                          gate = head_coefs(out_gate(ctx, true));
    if (dvx_) ctx.backend.fill_zero(dvx_, N * D * sizeof(float));
    if (atty_bf16_) {
      ctx.backend.attention_out_backward(datty_, dvx_, dattz_, atty_bf16_, heads_.v, ctx.B, ctx.T,
                                         c.n_head, c.head_dim(), alpha, gate);
    } else {
      ctx.backend.attention_out_backward(datty_, dvx_, dattz_, atty_, heads_.v, ctx.B, ctx.T,
                                         c.n_head, c.head_dim(), alpha, gate);
    }
  }
  const Operand dqkv = heads_backward(ctx);
  // The QKV projection's bias and weight gradients, d ln1, and through the norm into dres.
  ctx.linear.backward(ctx.dln, qkv_weight_grad(ctx), dqkv.f32, norm_.out(), qkv_weight(ctx), N, D,
                      3 * D, 0.0f, dqkv.bf16, ctx.params.grad_of(qkv_b_));
  if (qkv_lambda_) qkv_lambda_->end_grad(ctx);
  // Alone, the chain's stream reaches the output only through the branch's input (if at all).
  if (branch_.alone) ctx.backend.fill_zero(ctx.dres, N * D * sizeof(float));
  norm_.backward(ctx, branch_.input ? branch_.input->grad() : ctx.dres, ctx.dln, in_);
}

}  // namespace model
