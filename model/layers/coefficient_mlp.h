// Record #89's MUDD blocks and MUDD gates (model.mudd): a small MLP over the residual stream that
// makes K per-token coefficients, c = (gelu(x W1^T) W2^T + b) s, with the exact (erf) GELU,
// W1 [64, D], W2 [K, 64], b [K]. s is a constant (the MUDD blocks: 0.1) or a learned scalar
// shared by the gates (mudd_gate.scale, init 0.1). b is stored before the scale (the record's
// layout: its initial values are the effective ones divided by 0.1). The layer reads the stream
// as it is at its place in the chain (the record feeds the normalised x0 to gate 0 and the raw
// stream to the others, which is what the stream is at those places) and hands it on unchanged.
//
// Its output is an [N, K] array that other layers read through view() (model/coef_view.h): they
// add d loss / d coef into its gradient, which this layer zeroes in begin_backward and takes in
// its backward (after theirs, as it comes earlier in the forward), adding the path through the
// MLP into the stream's gradient.
//
// Precision: the first GEMM reads the stream as stored (bf16 in bf16 precision: W1 has a bf16
// copy); the hidden activations, W2 and the coefficients stay f32.
#pragma once

#include <string>

#include "model/coef_view.h"
#include "model/layer.h"

namespace model {

class CoefficientMlp : public Layer {
 public:
  static constexpr int kHidden = 64;

  // The parameters <prefix>.w1, <prefix>.w2 ([K, 64]: K is read from it), <prefix>.b2; the scale
  // is the parameter `scale_param` when given, else the constant `scale`.
  CoefficientMlp(Context& ctx, const std::string& prefix, float scale,
                 const std::string& scale_param = "");
  void plan(ActivationPlan& plan, const Context& ctx) override;
  Stream forward(Context& ctx, Stream x) override;
  void begin_backward(Context& ctx) override;
  void backward(Context& ctx) override;

  int64_t count() const { return K_; }
  // The coefficients [N, K] (stride K) and their gradient sum.
  CoefView view() const { return {coefs_, dcoefs_, K_}; }

 private:
  size_t w1_, w2_, b2_, scale_param_;
  float scale_;
  int64_t K_;
  Stream in_;
  // pre = x W1^T and act = gelu(pre) [N, 64]; zb = act W2^T + b [N, K] (before the scale);
  // coefs [N, K] and their gradient.
  float *pre_ = nullptr, *act_ = nullptr, *zb_ = nullptr, *coefs_ = nullptr, *dcoefs_ = nullptr;
  // Backward scratch: d zb, d act, d pre.
  float *dzb_ = nullptr, *dact_ = nullptr, *dpre_ = nullptr;
};

}  // namespace model
