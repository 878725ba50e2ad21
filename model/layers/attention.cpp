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
      norm_(ctx.config, block_param(ctx, block, "ln1.weight"), block_param(ctx, block, "ln1.bias")),
      qkv_w_(ctx.params.index("blocks." + std::to_string(block) + ".attn.qkv.weight")),
      qkv_b_(block_param(ctx, block, "attn.qkv.bias")),
      proj_w_(ctx.params.index("blocks." + std::to_string(block) + ".attn.proj.weight")),
      proj_b_(block_param(ctx, block, "attn.proj.bias")) {
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
}

Stream Attention::forward(Context& ctx, Stream x) {
  const ModelConfig& c = ctx.config;
  const int64_t B = ctx.B, T = ctx.T, N = B * T, D = c.d_model, H = c.n_head, hd = c.head_dim();
  in_ = branch_.input ? branch_.input->stream() : x;
  norm_.forward(ctx, in_);
  ctx.linear.forward_epilogue(qkv_, norm_.out(), qkv_weight(ctx), ctx.params.value(qkv_b_), N, D,
                              3 * D);
  heads_ = heads_forward(ctx);
  // Below fp32 a device may take attention's products to tensor cores too (TF32).
  // The output [B, T, H hd], the heads merged as written; in bf16 precision written as bf16.
  const bool tf32 = c.precision != Precision::Fp32;
  const float scale = c.attention_scale();
  const core::AttentionMask mask = masks_.mask(short_window_);
  const Heads& h = heads_;
  if (atty_bf16_) {
    ctx.backend.attention_forward(atty_bf16_, lse_, h.q, h.k, h.v, B * H, T, hd, scale, mask, tf32,
                                  layout(ctx));
  } else {
    ctx.backend.attention_forward(atty_, lse_, h.q, h.k, h.v, B * H, T, hd, scale, mask, tf32,
                                  layout(ctx));
  }
  const Operand atty{atty_, atty_bf16_};
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
  const int64_t B = ctx.B, T = ctx.T, H = c.n_head, hd = c.head_dim();
  const bool tf32 = c.precision != Precision::Fp32;
  const float scale = c.attention_scale();
  const core::AttentionMask mask = masks_.mask(short_window_);
  const Heads& h = heads_;
  if (atty_bf16_) {
    ctx.backend.attention_backward(dq, dk, dv, datty_, atty_bf16_, lse_, h.q, h.k, h.v, B * H, T,
                                   hd, scale, mask, tf32, layout(ctx));
  } else {
    ctx.backend.attention_backward(dq, dk, dv, datty_, atty_, lse_, h.q, h.k, h.v, B * H, T, hd,
                                   scale, mask, tf32, layout(ctx));
  }
}

void Attention::attention_backward(Context& ctx, core::bf16* dq, core::bf16* dk, core::bf16* dv) {
  const ModelConfig& c = ctx.config;
  const int64_t B = ctx.B, T = ctx.T, H = c.n_head, hd = c.head_dim();
  const bool tf32 = c.precision != Precision::Fp32;
  const Heads& h = heads_;
  ctx.backend.attention_backward(dq, dk, dv, datty_, atty_bf16_, lse_, h.q, h.k, h.v, B * H, T, hd,
                                 c.attention_scale(), masks_.mask(short_window_), tf32,
                                 layout(ctx));
}

void Attention::backward(Context& ctx) {
  const int64_t N = ctx.N(), D = ctx.config.d_model;
  // dres holds d/d res_mid; the residual path passes it through unchanged (alone: d y).
  ctx.linear.backward(datty_, proj_weight_grad(ctx), ctx.dres, {atty_, atty_bf16_},
                      proj_weight(ctx), N, D, D, 0.0f, nullptr, ctx.params.grad_of(proj_b_));
  if (proj_lambda_) proj_lambda_->end_grad(ctx);
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
