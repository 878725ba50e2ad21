// A block's mixture-of-experts branch (model.moe): res_out = x + sum over the token's top-k experts
// of gate x expert(norm(x)), each expert an MLP with the activation of model/layers/activation.h.
// The router (f32 in every precision: its top-k picks discrete experts) is softmax(x R^T); the
// gates are the chosen probabilities renormalised; the aux loss (weight model.moe.aux_weight)
// balances the experts' loads. Each expert's rows are contiguous (the dispatch), so each expert
// is one pair of GEMMs.
#pragma once

#include <vector>

#include "model/layer.h"
#include "model/layers/activation.h"
#include "model/layers/norm.h"

namespace model {

class Moe : public Layer {
 public:
  Moe(Context& ctx, int block);
  void plan(ActivationPlan& plan, const Context& ctx) override;
  Stream forward(Context& ctx, Stream x) override;
  void backward(Context& ctx) override;

 private:
  // The norm's output as the router's f32 input: in bf16 precision widened from the stored bf16
  // into a scratch.
  const float* router_input(Context& ctx);

  int block_;
  Norm norm_;
  Activation act_;
  size_t router_w_, fc_w_, proj_w_;
  Stream in_, out_;
  // probs [N, E]; the dispatched rows xe [M, D] (f32, or bf16 only), pre [M, F], act [M, F]
  // (f32, or bf16 only), the experts' outputs ye [M, D]; the routing; the host copy of its
  // offsets (the per-expert GEMMs' row counts).
  float *probs_ = nullptr, *xe_ = nullptr, *pre_ = nullptr, *act_f32_ = nullptr, *ye_ = nullptr;
  core::bf16 *xe_bf16_ = nullptr, *act_bf16_ = nullptr;
  core::MoeRouting route_;
  std::vector<int32_t> offset_;
  // Backward scratch shared by the blocks.
  float *dact_ = nullptr, *dxe_raw_ = nullptr, *dye_ = nullptr, *dxe_ = nullptr, *dgate_ = nullptr,
        *dprobs_ = nullptr, *drouter_ = nullptr, *router_in_ = nullptr;
};

}  // namespace model
