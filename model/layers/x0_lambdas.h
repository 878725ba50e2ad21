// The record's x0 lambdas (model.x0_lambdas): each block's input is l0 x + l1 x0, a learned pair
// per block (init 1, 0) mixing the stream with x0, the embedding output, which a StreamTap after
// the embeddings keeps (and whose gradient sum it takes).
#pragma once

#include "model/layer.h"
#include "model/layers/stream_tap.h"

namespace model {

class X0Lambdas : public Layer {
 public:
  X0Lambdas(Context& ctx, int block, const StreamTap& x0);
  void plan(ActivationPlan& plan, const Context& ctx) override;
  Stream forward(Context& ctx, Stream x) override;
  void backward(Context& ctx) override;

 private:
  size_t lambdas_;
  const StreamTap& x0_;
  Stream in_, out_;
};

}  // namespace model
