// The modern blocks' attention (arch modern): RMSNorm, no biases (in the base); the heads split to
// [B, H, T, hd], QK-norm per head over hd and rotary on the normalised q and k
// (model.rotary_base; model.rotary_truncate: the record's half-truncated form), in one pass. With
// v lambdas (the record: model.v_lambdas_all, or a block with a value-embedding table) v is
// l0 v (+ l1 ve, ve the block's table in the heads' layout) with the block's learned pair
// attn.v_lambdas (init 0.5, 0.5). With model.key_offset a long-window block shifts the keys'
// unrotated dimensions by one position (model/layers/key_offset.h). With BranchWiring::aux_v a
// tap's stream, read as the heads' rows, is added to v last. The backward goes through f32 dq,
// dk, dv.
//
// Record #89's paired heads (model.paired_head_layers; train_gpt.py CausalSelfAttention with
// paired=True): q and k are rotated with the paired table, head h of token t at position
// 2t + h mod 2, and q, k, v [T, H, hd] are viewed as [2T, H / 2, hd]: position 2t + i of slot s
// is head s + i H / 2 of token t, so heads h and h + H / 2 attend as one head over an
// interleaved sequence of 2T (in slot s odd, a head's place in it and its rotary position are
// swapped). The engine merges the rotated heads into token rows [B, T, H hd], which is that view
// (HeadStrides row D / 2), and the attention op runs B H / 2 heads of 2T; its output in the same
// view is the output projection's input as written. No key offset in these blocks (the record
// shifts only unpaired ones).
#pragma once

#include <optional>

#include "model/layers/attention.h"
#include "model/layers/key_offset.h"
#include "model/layers/value_embeddings.h"

namespace model {

class RotaryAttention : public Attention {
 public:
  // `tables` the value embeddings (null without them).
  RotaryAttention(Context& ctx, int block, const AttentionMasks& masks, ValueEmbeddings* tables,
                  BranchWiring branch = {});

 protected:
  void plan_heads(ActivationPlan& plan, const Context& ctx) override;
  Heads heads_forward(Context& ctx) override;
  core::AttentionLayout layout(const Context& ctx) const override;
  Operand heads_backward(Context& ctx) override;

 private:
  // The rotary's YaRN frequencies and paired positions for this block.
  core::RotaryVariant rotary_variant() const;
  ValueEmbeddings* tables_;
  int table_;  // the value-embedding table this block mixes in, or -1
  size_t v_lambdas_;
  std::optional<KeyOffset> key_offset_;  // long-window blocks with model.key_offset
  const StreamTap* aux_v_;               // a stream added to v (BranchWiring::aux_v), or null
  // The heads q, k, v [B, H, T, hd], their QK-norm rstd [B, H, T], the normalised, rotated qr and
  // kr, and vmix the mixed v (with v lambdas).
  float *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *q_rstd_ = nullptr, *k_rstd_ = nullptr,
        *qr_ = nullptr, *kr_ = nullptr, *vmix_ = nullptr, *vaux_ = nullptr;
  // Backward scratch shared by the blocks.
  float *dq_ = nullptr, *dk_ = nullptr, *dv_ = nullptr, *aux_rows_ = nullptr;
  // Paired heads: q, k, v in token rows [B, T, H hd] (the paired view) and their gradients
  // (backward scratch shared by the blocks).
  float *qp_ = nullptr, *kp_ = nullptr, *vp_ = nullptr;
  float *dqp_ = nullptr, *dkp_ = nullptr, *dvp_ = nullptr;
};

}  // namespace model
