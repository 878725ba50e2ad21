// The record's U-net skips (model.unet_skips): with n = n_layer / 2, block n_layer - n + i first
// adds skip_weights[i] times the output of block n - 1 - i, its mirror. A StreamTap at the
// end of the mirror block keeps that output (and takes its gradient from the skip); SkipAdd sits
// at the start of the later block.
#pragma once

#include "model/layer.h"
#include "model/layers/stream_tap.h"

namespace model {

class SkipAdd : public Layer {
 public:
  // Skip i (skip_weights[i]) from `source`.
  SkipAdd(Context& ctx, int i, const StreamTap& source);
  void plan(ActivationPlan& plan, const Context& ctx) override;
  Stream forward(Context& ctx, Stream x) override;
  void backward(Context& ctx) override;

 private:
  size_t weights_;
  int i_;
  const StreamTap& source_;
  Stream in_, out_;
};

}  // namespace model
