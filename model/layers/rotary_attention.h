// The modern blocks' attention (arch modern): RMSNorm, no biases (in the base); the heads split to
// [B, H, T, hd], QK-norm per head over hd and rotary on the normalised q and k
// (model.rotary_base; model.rotary_truncate: the record's half-truncated form), in one pass. With
// v lambdas (the record: model.v_lambdas_all, or a block with a value-embedding table) v is
// l0 v (+ l1 ve, ve the block's table in the heads' layout) with the block's learned pair
// attn.v_lambdas (init 0.5, 0.5). With model.key_offset a long-window block shifts the keys'
// unrotated dimensions by one position (model/layers/key_offset.h). With BranchWiring::aux_v a
// tap's stream, read as the heads' rows, is added to v last. The backward goes through f32 dq,
// dk, dv.
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
};

}  // namespace model
