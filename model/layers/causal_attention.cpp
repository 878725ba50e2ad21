#include "model/layers/causal_attention.h"

namespace model {

Attention::Heads CausalAttention::heads_forward(Context& ctx) {
  const int64_t D = ctx.config.d_model;
  return {qkv_, qkv_ + D, qkv_ + 2 * D};  // 3 D floats a token
}

core::AttentionLayout CausalAttention::layout(const Context& ctx) const {
  using L = core::AttentionLayout;
  const int64_t T = ctx.T, D = ctx.config.d_model, H = ctx.config.n_head,
                hd = ctx.config.head_dim();
  const core::HeadStrides in = L::token_rows(T, hd, 3 * D);
  return {H, in, in, in, L::token_rows(T, hd, D)};
}

Operand CausalAttention::heads_backward(Context& ctx) {
  const int64_t D = ctx.config.d_model;
  // dq, dk, dv written (=) into d qkv's columns.
  if (dqkv_bf16_) {
    attention_backward(ctx, dqkv_bf16_, dqkv_bf16_ + D, dqkv_bf16_ + 2 * D);
  } else {
    attention_backward(ctx, dqkv_, dqkv_ + D, dqkv_ + 2 * D);
  }
  return {dqkv_, dqkv_bf16_};
}

}  // namespace model
