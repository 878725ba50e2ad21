// The MLP's activation: GELU (tanh form, gpt2) or ReLU² (modern), forward and backward, for the
// dense MLP and the MoE experts alike.
#pragma once

#include "model/layer.h"

namespace model {

class Activation {
 public:
  explicit Activation(const ModelConfig& config) : gelu_(config.arch == Arch::Gpt2) {}
  bool gelu() const { return gelu_; }
  // The backward's d pre scratch (rows x F of the largest user; shared by name).
  void plan(ActivationPlan& plan, int64_t n);
  // act(pre [n]) into out or out_bf16 (whichever is not null).
  void forward(Context& ctx, float* out, core::bf16* out_bf16, const float* pre, int64_t n) const;
  // d pre [n] from dout: accumulated into the zeroed f32 scratch, or in bf16 precision written as
  // bf16; returns the one written, as the next GEMMs' output gradient.
  Operand backward(Context& ctx, const float* pre, const float* dout, int64_t n) const;
  // The f32 scratch d pre (null in bf16 precision): the dgelu epilogue writes it.
  float* dpre() const { return dpre_; }

 private:
  bool gelu_;
  float* dpre_ = nullptr;
  core::bf16* dpre_bf16_ = nullptr;
};

}  // namespace model
