#include "model/layers/attention_mask.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/check.h"

namespace model {

void AttentionMasks::plan(ActivationPlan& plan, const Context& ctx) {
  if (!config_.masked_attention()) return;
  if (config_.yarn) yarn_freq_ = plan.f32(config_.head_dim() / 2);
  key_begin_long_ = plan.i32(ctx.N());
  key_begin_short_ = plan.i32(ctx.N());
  if (config_.paired_head_layers.empty()) return;
  paired_begin_long_ = plan.i32(2 * ctx.N());
  paired_begin_short_ = plan.i32(2 * ctx.N());
}

void AttentionMasks::set_window(int window, bool rescale, int short_window) {
  ENGINE_CHECK(config_.window > 0 && window > 0,
               "model: set_attention_window needs model.window and a positive window, got " +
                   std::to_string(window));
  ENGINE_CHECK(short_window >= 0 && short_window <= window,
               "model: set_attention_window's short window must be in [0, the long window " +
                   std::to_string(window) + "], got " + std::to_string(short_window));
  window_ = window;
  short_window_ = short_window;
  if (config_.yarn) yarn_.set_window(window, rescale);
}

float AttentionMasks::attention_scale() const {
  const float scale = config_.attention_scale();
  return config_.yarn ? static_cast<float>(double(scale) * yarn_.scale()) : scale;
}

int32_t AttentionMasks::window_begin(int32_t t, bool short_window) const {
  if (window_ <= 0) return 0;
  const int block = config_.window_block;
  if (block == 0) {
    const int w = !short_window       ? window_
                  : short_window_ > 0 ? short_window_
                                      : std::max(1, window_ / 2);
    return std::max(0, t - w + 1);
  }
  // The record's block masks (train_gpt.py create_blockmasks): a query in block t / block keeps
  // the n nearest blocks of its document, n = window / block (short: n / 2), where n = 0 keeps
  // the query's own block (its diagonal block mask). The last block of a row shorter than a
  // multiple of the block is a block like the others, only shorter.
  const int n_long = window_ / block;
  const int n_short = short_window_ > 0 ? short_window_ / block : n_long / 2;
  const int n = std::max(1, short_window ? n_short : n_long);
  return std::max(0, (t / block - n + 1) * block);
}

void AttentionMasks::set_tokens(Context& ctx, const int32_t* tokens) {
  if (!config_.masked_attention()) return;
  const int B = ctx.B, T = ctx.T;
  // Position t sees keys from max(start of its document, window_begin(t)): both only grow with t.
  // The paired blocks' sequence: position p of 2T holds token p / 2, its document starting at
  // twice the token's.
  const bool paired = !config_.paired_head_layers.empty();
  std::vector<int32_t> begins[4];
  for (int s = 0; s < (paired ? 4 : 2); ++s) {
    const int per_token = s < 2 ? 1 : 2, length = per_token * T;
    begins[s].resize(static_cast<size_t>(B) * length);
    for (int b = 0; b < B; ++b) {
      int32_t doc = 0;
      for (int p = 0; p < length; ++p) {
        const int t = p / per_token;
        if (config_.doc_bos >= 0 && p % per_token == 0 && tokens[b * T + t] == config_.doc_bos)
          doc = p;
        begins[s][b * length + p] = std::max(doc, window_begin(p, s % 2 == 1));
      }
    }
  }
  int32_t* dst[4] = {key_begin_long_, key_begin_short_, paired_begin_long_, paired_begin_short_};
  for (int s = 0; s < (paired ? 4 : 2); ++s)
    ctx.backend.copy_from_host(dst[s], begins[s].data(), begins[s].size() * sizeof(int32_t));
  if (yarn_freq_) {
    const std::vector<float> freq(yarn_.frequencies().begin(), yarn_.frequencies().end());
    ctx.backend.copy_from_host(yarn_freq_, freq.data(), freq.size() * sizeof(float));
  }
}

core::AttentionMask AttentionMasks::mask(bool short_window, bool paired) const {
  if (!config_.masked_attention()) return {};
  if (paired) return {short_window ? paired_begin_short_ : paired_begin_long_, config_.n_head / 2};
  return {short_window ? key_begin_short_ : key_begin_long_, config_.n_head};
}

}  // namespace model
