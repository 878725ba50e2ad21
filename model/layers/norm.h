// The pre-norm of a block's branch or of the head: LayerNorm (gpt2, with weight and bias
// parameters, eps 1e-5) or RMSNorm (modern, no parameters, model.norm_eps) over [N, D]. The input
// is the residual stream (f32, or bf16 in bf16 precision; the statistics f32), the output the
// next GEMM's input: f32, or in bf16 precision bf16 only.
#pragma once

#include "model/layer.h"

namespace model {

class Norm {
 public:
  // weight and bias: the LayerNorm's parameters; kNoParam for RMSNorm.
  Norm(const ModelConfig& config, size_t weight, size_t bias);
  void plan(ActivationPlan& plan, const Context& ctx);
  void forward(Context& ctx, Stream inp);
  // dinp += d loss / d inp from dout (and the LayerNorm's parameter gradients).
  void backward(Context& ctx, float* dinp, const float* dout, Stream inp);
  Operand out() const { return {out_, out_bf16_}; }

 private:
  bool layer_norm_;
  float eps_;
  size_t weight_, bias_;
  float *out_ = nullptr, *mean_ = nullptr, *rstd_ = nullptr;
  core::bf16* out_bf16_ = nullptr;
};

}  // namespace model
