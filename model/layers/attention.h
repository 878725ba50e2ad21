// A block's attention branch: res_mid = x + proj(attention(q, k, v)) with q, k, v from
// qkv(norm(x)), causal, scaled by model.attn_scale (default 1/sqrt(hd)) and masked by
// AttentionMasks (documents, the long or the short window). This base holds what every form
// shares: the norm, the QKV and output projections, the attention op and their backward (with a
// BranchWiring: the output proj(...) alone, the input a tap's stream; with model.qkvo_lambdas the
// two projections' weights scaled by attn.qkvo_lambdas, model/layers/weight_lambda.h). Where
// q, k and v come from is the form's: gpt2's (causal_attention.h) reads them in place from qkv,
// the modern one (rotary_attention.h) splits the heads, normalises and rotates them.
//
// Record #89's corrections of the output before the projection, per token t and head h
// (core AttentionOps::attention_out_forward): XSA (model.xsa_layers) y -= tanh(alpha[t, h])
// (y.v / max(|v|^2, 1e-8)) v with v the value the attention read, and the output gate
// (model.attn_gate_layers) y *= gate[t, h]. alpha and gate are CoefViews (model/coef_view.h), here
// the block's learned per-head blocks.<i>.attn.xsa_alpha and attn.out_gate read with stride 0.
#pragma once

#include <optional>

#include "model/coef_view.h"
#include "model/layer.h"
#include "model/layers/attention_mask.h"
#include "model/layers/norm.h"
#include "model/layers/stream_tap.h"
#include "model/layers/weight_lambda.h"

namespace model {

class Attention : public Layer {
 public:
  void plan(ActivationPlan& plan, const Context& ctx) override;
  Stream forward(Context& ctx, Stream x) override;
  void backward(Context& ctx) override;

 protected:
  Attention(Context& ctx, int block, const AttentionMasks& masks, BranchWiring branch = {});

  struct Heads {
    const float *q, *k, *v;
  };
  // The form's arrays (both passes of the plan).
  virtual void plan_heads(ActivationPlan& plan, const Context& ctx) = 0;
  // q, k and v for the attention op from qkv_ [N, 3D].
  virtual Heads heads_forward(Context& ctx) = 0;
  // Where q, k, v and the output live (core::AttentionLayout).
  virtual core::AttentionLayout layout(const Context& ctx) const = 0;
  // From datty_ (d of attention's output): through the attention op and the form's heads to
  // d qkv, returned as the QKV projection's output gradient (f32 or bf16).
  virtual Operand heads_backward(Context& ctx) = 0;

  // The attention op's backward into f32 dq, dk, dv, from the output as stored (f32 or bf16),
  // and into bf16 ones (bf16 precision, which stores the output bf16).
  void attention_backward(Context& ctx, float* dq, float* dk, float* dv);
  void attention_backward(Context& ctx, core::bf16* dq, core::bf16* dk, core::bf16* dv);
  // This forward's q, k and v.
  const Heads& heads() const { return heads_; }

  // The attention op's heads and rows: B H of T, or a paired-head block's B H / 2 of 2T.
  int64_t op_heads(const Context& ctx) const;
  int64_t op_rows(const Context& ctx) const { return paired_ ? 2 * ctx.T : ctx.T; }
  core::AttentionMask op_mask() const { return masks_.mask(short_window_, paired_); }
  // XSA's alpha and the output gate (undefined: off), with gradients for the backward.
  CoefView xsa_alpha(const Context& ctx, bool backward) const;
  CoefView out_gate(const Context& ctx, bool backward) const;
  bool corrected() const { return xsa_alpha_ != kNoParam || out_gate_ != kNoParam; }
  // What the output projection reads: atty, or with the corrections attz.
  Operand projection_input() const;

  int block_;
  const AttentionMasks& masks_;
  BranchWiring branch_;
  bool short_window_;
  bool paired_;  // model.paired_head_layers: q, k, v in the layout of the paired view
  Norm norm_;
  size_t qkv_w_, qkv_b_, proj_w_, proj_b_;
  std::optional<WeightLambda> qkv_lambda_, proj_lambda_;  // model.qkvo_lambdas
  size_t xsa_alpha_, out_gate_;
  // Saved for the backward: the input, the norm's output (in norm_), qkv [N, 3D], lse [B*H, T],
  // atty the output [B, T, H hd] (f32, or in bf16 precision bf16 only).
  Stream in_, out_;
  float *qkv_ = nullptr, *lse_ = nullptr, *atty_ = nullptr;
  core::bf16* atty_bf16_ = nullptr;
  // Backward scratch shared by the blocks: d atty, d qkv (f32, or in bf16 precision bf16).
  float *datty_ = nullptr, *dqkv_ = nullptr;
  core::bf16* dqkv_bf16_ = nullptr;
  // With the corrections: their output attz (the projection's input; f32, or bf16 only), the
  // projection's output gradient d attz and XSA's d v (backward scratch shared by the blocks).
  float* attz_ = nullptr;
  core::bf16* attz_bf16_ = nullptr;
  float *dattz_ = nullptr, *dvx_ = nullptr;

 private:
  // The projections' weights as their GEMMs read them, and where their weight gradients go.
  Operand qkv_weight(Context& ctx);
  Operand proj_weight(Context& ctx);
  float* qkv_weight_grad(Context& ctx);
  float* proj_weight_grad(Context& ctx);

  Heads heads_;
};

}  // namespace model
