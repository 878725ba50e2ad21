// Record #89's skip gate (model.mudd): block 6, which has no attention, adds
// sigmoid(skip_lambda) g_skip[n] cache3, g_skip a per-token column of MUDD gate 1 (its column 28).
// This layer makes that coefficient, an [N] column (stride 1) that a StreamMix term reads; its
// backward, after the mix's, sends the gradient to the gate's column and to skip_lambda. It hands
// the stream on unchanged.
#pragma once

#include <string>

#include "model/layer.h"
#include "model/layers/stream_mix.h"

namespace model {

class SkipGate : public Layer {
 public:
  SkipGate(Context& ctx, const std::string& lambda_param, CoefOf gate);
  void plan(ActivationPlan& plan, const Context& ctx) override;
  Stream forward(Context& ctx, Stream x) override;
  void begin_backward(Context& ctx) override;
  void backward(Context& ctx) override;

  CoefView view() const { return {out_, dout_, 1}; }

 private:
  size_t lambda_;
  CoefOf gate_;
  float *out_ = nullptr, *dout_ = nullptr;  // [N] and its gradient
};

}  // namespace model
