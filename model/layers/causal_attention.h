// GPT-2's attention (arch gpt2): LayerNorm and biases (in the base), q, k and v read in place
// from qkv [B, T, 3, H, hd], and the attention op's backward written straight into d qkv's
// columns (in bf16 precision as bf16, which the QKV projection's GEMMs and bias gradient read).
#pragma once

#include "model/layers/attention.h"

namespace model {

class CausalAttention : public Attention {
 public:
  CausalAttention(Context& ctx, int block, const AttentionMasks& masks)
      : Attention(ctx, block, masks) {}

 protected:
  void plan_heads(ActivationPlan& /*plan*/, const Context& /*ctx*/) override {}
  Heads heads_forward(Context& ctx) override;
  core::AttentionLayout layout(const Context& ctx) const override;
  Operand heads_backward(Context& ctx) override;
};

}  // namespace model
