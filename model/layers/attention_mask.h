// Attention masks beyond causality, shared by the attention blocks: with model.doc_bos a token
// sees only its own document (from the last doc_bos at or before it); with model.window a long
// window ('L' blocks of model.window_pattern) and a short one ('S', half of it), token-granular or
// in blocks of model.window_block tokens (the record's FlexAttention block masks). Made from the
// tokens of each forward as each position's first visible key (core::AttentionMask). With
// model.paired_head_layers also the masks of the interleaved sequence of 2T the paired blocks
// attend over: position p = 2t + i (token t) sees from twice its document's start, the window
// counted in positions of that sequence (the record passes flash attention doubled cu_seqlens
// and the same window, which so covers half as many tokens). With model.yarn the window's changes
// also rescale the rotary frequencies and the attention scale (model/layers/yarn.h), which the
// attention blocks read from here.
#pragma once

#include <cstdint>

#include "model/layer.h"
#include "model/layers/yarn.h"

namespace model {

class AttentionMasks {
 public:
  explicit AttentionMasks(const ModelConfig& config)
      : config_(config), window_(config.window), yarn_(config) {}
  void plan(ActivationPlan& plan, const Context& ctx);
  // The masks of this forward's tokens (host [B, T]).
  void set_tokens(Context& ctx, const int32_t* tokens);
  // The long window from the next forward on; with model.yarn, rescaling the rotary and the scale
  // (unless `rescale` is false: the final validation's wider window). The short window is
  // `short_window` when positive, else half the long one.
  void set_window(int window, bool rescale = true, int short_window = 0);
  int window() const { return window_; }
  // The mask of a block that uses the short window or the long one (none: plain causal); `paired`
  // that of a paired-head block, over [B, 2T] positions of H / 2 heads.
  core::AttentionMask mask(bool short_window, bool paired = false) const;
  // model.attn_scale (or 1/sqrt(hd)) times YaRN's factor.
  float attention_scale() const;
  // YaRN's rotary frequencies on the device [head_dim / 2] (null without model.yarn: the
  // rotary's own).
  const float* rotary_frequencies() const { return yarn_freq_; }

 private:
  // The first key the window leaves position t (counted from its row's start).
  int32_t window_begin(int32_t t, bool short_window) const;
  const ModelConfig& config_;
  int window_;
  int short_window_ = 0;  // 0: half of window_
  int32_t *key_begin_long_ = nullptr, *key_begin_short_ = nullptr;
  // The paired-head blocks' [B, 2T] (planned only with paired_head_layers).
  int32_t *paired_begin_long_ = nullptr, *paired_begin_short_ = nullptr;
  Yarn yarn_;
  float* yarn_freq_ = nullptr;  // yarn_'s frequencies, uploaded with each forward's tokens
};

}  // namespace model
