// The record's x0 lambdas (model.x0_lambdas): each block's input is l0 x + l1 x0, a learned pair
// per block (init 1, 0) mixing the stream with x0, the embedding output. X0Source sits after the
// embeddings: it keeps x0 and sums the blocks' gradients of it into the stream's gradient.
#pragma once

#include "model/layer.h"

namespace model {

class X0Source : public Layer {
 public:
  void plan(ActivationPlan& plan, const Context& ctx) override;
  Stream forward(Context& ctx, Stream x) override;
  void begin_backward(Context& ctx) override;
  void backward(Context& ctx) override;

  Stream x0() const { return x0_; }
  float* x0_grad() const { return dx0_; }

 private:
  Stream x0_;
  float* dx0_ = nullptr;  // d x0 summed over the blocks
};

class X0Lambdas : public Layer {
 public:
  X0Lambdas(Context& ctx, int block, const X0Source& source);
  void plan(ActivationPlan& plan, const Context& ctx) override;
  Stream forward(Context& ctx, Stream x) override;
  void backward(Context& ctx) override;

 private:
  size_t lambdas_;
  const X0Source& source_;
  Stream in_, out_;
};

}  // namespace model
