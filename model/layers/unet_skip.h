// The record's U-net skips (model.unet_skips): with n = n_layer / 2, block n_layer - n + i first
// adds skip_weights[i] times the output of block n - 1 - i, its mirror. SkipSource sits at the
// end of the mirror block: it keeps that output and adds its gradient from the skip to the
// stream's; SkipAdd sits at the start of the later block.
#pragma once

#include "model/layer.h"

namespace model {

class SkipSource : public Layer {
 public:
  void plan(ActivationPlan& plan, const Context& ctx) override;
  Stream forward(Context& ctx, Stream x) override;
  void begin_backward(Context& ctx) override;
  void backward(Context& ctx) override;

  Stream out() const { return out_; }
  float* out_grad() const { return dout_; }

 private:
  Stream out_;
  float* dout_ = nullptr;  // d (the block's output) through the skip
};

class SkipAdd : public Layer {
 public:
  // Skip i (skip_weights[i]) from `source`.
  SkipAdd(Context& ctx, int i, const SkipSource& source);
  void plan(ActivationPlan& plan, const Context& ctx) override;
  Stream forward(Context& ctx, Stream x) override;
  void backward(Context& ctx) override;

 private:
  size_t weights_;
  int i_;
  const SkipSource& source_;
  Stream in_, out_;
};

}  // namespace model
