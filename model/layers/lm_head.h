// The head: the final norm, the logits z = lnf W^T (W the untied lm_head.weight, or gpt2's
// embedding), and the loss: the mean over the N positions of the soft-capped cross-entropy
// (model/layers/softcap.h), over the real vocabulary or, with model.loss_over_padding, all of the
// padded one; in training with loss terms (Gpt::set_loss_weights, record #89) each position's
// loss is the weighted sum of its terms' cross-entropies (kmath::LossTerms). The fused loss kernel
// overwrites the logits with d loss / d logits for the backward's GEMMs (in bf16 precision the
// logits are stored bf16 only, and so is the gradient). Without targets (sampling) only the final
// norm runs; last_logits() reads the last positions.
#pragma once

#include <vector>

#include "model/layer.h"
#include "model/layers/norm.h"
#include "model/layers/softcap.h"

namespace model {

class LmHead : public Layer {
 public:
  explicit LmHead(Context& ctx);
  void plan(ActivationPlan& plan, const Context& ctx) override;
  Stream forward(Context& ctx, Stream x) override;
  void backward(Context& ctx) override;
  // Capped logits of the last position of each row after a forward without targets: host [B, V]
  // (padding dropped).
  std::vector<float> last_logits(Context& ctx);

 protected:
  // Whether the logits (and their gradient) are stored in bf16 only.
  virtual bool bf16_logits(const Context& ctx) const;
  // logits_ (f32) or logits_bf16_ = gain lnf W^T.
  virtual void logits_forward(Context& ctx, float gain);
  // The factor of d (a token's loss) / d logits in what the loss kernel writes for the backward:
  // the gain / N of the mean (the head's GEMMs multiply it as written).
  virtual float dlogits_scale(const Context& ctx, float gain) const;
  // From d logits in the logits' buffer: ctx.dln = d lnf and W's gradient.
  virtual void logits_backward(Context& ctx);

  Norm norm_;
  LogitCap cap_;
  size_t head_;
  Stream in_;
  // The logits [N, Vp], then d loss / d logits: f32, or bf16 only (bf16_logits()).
  float* logits_ = nullptr;
  core::bf16* logits_bf16_ = nullptr;
  float* losses_ = nullptr;  // [N]
  // The cap's bias() in each of the Vp columns (with an offset only), added to the f32 logits.
  float* cap_bias_ = nullptr;

 private:
  // Sampling: the last positions' rows of the norm [B, D] and their logits [B, Vp], stored as the
  // loss reads them (f32, or bf16 where the loss reads bf16 logits).
  int32_t* last_index_ = nullptr;
  float *last_hidden_ = nullptr, *last_logits_ = nullptr;
  core::bf16 *last_hidden_bf16_ = nullptr, *last_logits_bf16_ = nullptr;
};

}  // namespace model
