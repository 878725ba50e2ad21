// A block's dense MLP branch: res_out = x + proj(act(fc(norm(x)))), F = 4 D, with the activation
// of model/layers/activation.h. gpt2: LayerNorm and biases; with f32 activations its GELU runs in
// the fc GEMM's epilogue (bias_gelu) and the backward's in the proj dx GEMM's (dgelu). With a
// BranchWiring: the output proj(...) alone, the input a tap's stream.
#pragma once

#include "model/layer.h"
#include "model/layers/activation.h"
#include "model/layers/norm.h"
#include "model/layers/stream_tap.h"

namespace model {

class Mlp : public Layer {
 public:
  Mlp(Context& ctx, int block, BranchWiring branch = {});
  void plan(ActivationPlan& plan, const Context& ctx) override;
  Stream forward(Context& ctx, Stream x) override;
  void backward(Context& ctx) override;

 protected:
  // Whether GELU runs in the GEMMs' epilogues. In bf16 precision the activation is stored in
  // bf16 and its backward reads the f32 pre-activation, which cuBLASLt's epilogue (aux in D's
  // dtype) cannot keep: there the bias stays in the epilogue and GELU a pass of its own
  // (docs/precision.md).
  bool fused_gelu() const { return act_.gelu() && fc_b_ != kNoParam && !act_bf16_; }

  BranchWiring branch_;
  Norm norm_;
  Activation act_;
  size_t fc_w_, fc_b_, proj_w_, proj_b_;
  Stream in_, out_;
  // pre [N, F] f32; act [N, F] f32, or in bf16 precision bf16 only.
  float *pre_ = nullptr, *act_f32_ = nullptr;
  core::bf16* act_bf16_ = nullptr;
  float* dact_ = nullptr;  // shared backward scratch
};

}  // namespace model
