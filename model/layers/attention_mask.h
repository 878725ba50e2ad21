// Attention masks beyond causality, shared by the attention blocks: with model.doc_bos a token
// sees only its own document (from the last doc_bos at or before it); with model.window a long
// window ('L' blocks of model.window_pattern) and a short one ('S', half of it), token-granular or
// in blocks of model.window_block tokens (the record's FlexAttention block masks). Made from the
// tokens of each forward as each position's first visible key (core::AttentionMask).
#pragma once

#include <cstdint>

#include "model/layer.h"

namespace model {

class AttentionMasks {
 public:
  explicit AttentionMasks(const ModelConfig& config) : config_(config), window_(config.window) {}
  void plan(ActivationPlan& plan, const Context& ctx);
  // The masks of this forward's tokens (host [B, T]).
  void set_tokens(Context& ctx, const int32_t* tokens);
  // The long window from the next forward on.
  void set_window(int window);
  int window() const { return window_; }
  // The mask of a block that uses the short window or the long one (none: plain causal).
  core::AttentionMask mask(bool short_window) const;

 private:
  // The first key the window leaves position t (counted from its row's start).
  int32_t window_begin(int32_t t, bool short_window) const;
  const ModelConfig& config_;
  int window_;
  int32_t *key_begin_long_ = nullptr, *key_begin_short_ = nullptr;
};

}  // namespace model
