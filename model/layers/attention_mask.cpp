#include "model/layers/attention_mask.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/check.h"

namespace model {

void AttentionMasks::plan(ActivationPlan& plan, const Context& ctx) {
  if (!config_.masked_attention()) return;
  key_begin_long_ = plan.i32(ctx.N());
  key_begin_short_ = plan.i32(ctx.N());
}

void AttentionMasks::set_window(int window) {
  ENGINE_CHECK(config_.window > 0 && window > 0,
               "model: set_attention_window needs model.window and a positive window, got " +
                   std::to_string(window));
  window_ = window;
}

int32_t AttentionMasks::window_begin(int32_t t, bool short_window) const {
  if (window_ <= 0) return 0;
  const int block = config_.window_block;
  if (block == 0) {
    const int w = short_window ? std::max(1, window_ / 2) : window_;
    return std::max(0, t - w + 1);
  }
  // The record's block masks (train_gpt.py create_blockmasks): a query in block t / block keeps
  // the n nearest blocks of its document, n = window / block (short: n / 2), where n = 0 keeps
  // the query's own block (its diagonal block mask). The last block of a row shorter than a
  // multiple of the block is a block like the others, only shorter.
  const int n_long = window_ / block;
  const int n = std::max(1, short_window ? n_long / 2 : n_long);
  return std::max(0, (t / block - n + 1) * block);
}

void AttentionMasks::set_tokens(Context& ctx, const int32_t* tokens) {
  if (!config_.masked_attention()) return;
  const int B = ctx.B, T = ctx.T;
  // Position t sees keys from max(start of its document, window_begin(t)): both only grow with t.
  std::vector<int32_t> begins[2];
  for (int s = 0; s < 2; ++s) {
    begins[s].resize(static_cast<size_t>(B) * T);
    for (int b = 0; b < B; ++b) {
      int32_t doc = 0;
      for (int t = 0; t < T; ++t) {
        if (config_.doc_bos >= 0 && tokens[b * T + t] == config_.doc_bos) doc = t;
        begins[s][b * T + t] = std::max(doc, window_begin(t, s == 1));
      }
    }
  }
  ctx.backend.copy_from_host(key_begin_long_, begins[0].data(), begins[0].size() * sizeof(int32_t));
  ctx.backend.copy_from_host(key_begin_short_, begins[1].data(),
                             begins[1].size() * sizeof(int32_t));
}

core::AttentionMask AttentionMasks::mask(bool short_window) const {
  if (!config_.masked_attention()) return {};
  return {short_window ? key_begin_short_ : key_begin_long_, config_.n_head};
}

}  // namespace model
