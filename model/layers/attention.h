// A block's attention branch: res_mid = x + proj(attention(qkv(norm(x)))). gpt2: LayerNorm, biases,
// q, k and v read in place from qkv [B, T, 3, H, hd]. modern: RMSNorm, no biases, the heads split
// to [B, H, T, hd], QK-norm per head and rotary (model.rotary_base, model.rotary_truncate). The
// options of the record: v = l0 v (+ l1 ve, a value-embedding table) with a learned pair
// (attn.v_lambdas), the score scale model.attn_scale, and the masks of AttentionMasks (documents,
// the long or the short window).
#pragma once

#include "model/layer.h"
#include "model/layers/attention_mask.h"
#include "model/layers/norm.h"
#include "model/layers/value_embeddings.h"

namespace model {

class Attention : public Layer {
 public:
  // Block `block`'s attention; `tables` the value embeddings (null without them).
  Attention(Context& ctx, int block, const AttentionMasks& masks, ValueEmbeddings* tables);
  void plan(ActivationPlan& plan, const Context& ctx) override;
  Stream forward(Context& ctx, Stream x) override;
  void backward(Context& ctx) override;

 private:
  // Where q, k, v and the output live (core::AttentionLayout): GPT-2's q, k, v in place in qkv
  // [B, T, 3, H, hd], the modern blocks' in their heads [B, H, T, hd]; the output [B, T, D].
  core::AttentionLayout layout(const Context& ctx) const;
  // From d qkv (f32 or bf16) on: the QKV bias and weight gradients, d ln1, and through the norm
  // into dres.
  void qkv_backward(Context& ctx, Operand dqkv);

  bool modern_, short_window_;
  const AttentionMasks& masks_;
  ValueEmbeddings* tables_;
  int table_;  // the value-embedding table this block mixes in, or -1
  Norm norm_;
  size_t qkv_w_, qkv_b_, proj_w_, proj_b_, v_lambdas_;

  // Saved for the backward: the input, the norm's output (in norm_), qkv [N, 3D]; modern: the
  // heads q, k, v, their QK-norm rstd and the normalised, rotated qr and kr; vmix the mixed v;
  // lse [B*H, T]; atty the output [B, T, H hd] (f32, or in bf16 precision bf16 only).
  Stream in_, out_;
  float *qkv_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *q_rstd_ = nullptr,
        *k_rstd_ = nullptr, *qr_ = nullptr, *kr_ = nullptr, *vmix_ = nullptr, *lse_ = nullptr,
        *atty_ = nullptr;
  core::bf16* atty_bf16_ = nullptr;
  // Backward scratch shared by the blocks.
  float *dqkv_ = nullptr, *dq_ = nullptr, *dk_ = nullptr, *dv_ = nullptr, *datty_ = nullptr;
  core::bf16* dqkv_bf16_ = nullptr;
};

}  // namespace model
