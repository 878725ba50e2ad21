// Record #89's partial key offset (model.key_offset): in a block with the long window, after
// QK-norm and the truncated rotary, the key dimensions the rotary leaves unrotated take the
// previous position's values, k[t, :, unrotated] = k[t - 1, :, unrotated] for t >= 1 (across
// documents), so one layer can match a token against its predecessor's (an induction head in one
// layer). Part of a rotary attention's heads: it reads the rotated keys and hands on the shifted
// ones; its backward is the reverse shift (core AttentionOps::key_offset_forward).
#pragma once

#include "model/layer.h"

namespace model {

class KeyOffset {
 public:
  void plan(ActivationPlan& plan, const Context& ctx);
  // The shifted keys [B, H, T, hd] from the rotated ones kr.
  const float* forward(Context& ctx, const float* kr);
  // d kr from d (the shifted keys) dk: the reverse shift, into this layer's scratch, returned.
  const float* backward(Context& ctx, const float* dk);

 private:
  float* shifted_ = nullptr;  // [B, H, T, hd]
  float* dkr_ = nullptr;      // backward scratch shared by the blocks
};

}  // namespace model
