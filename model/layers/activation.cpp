#include "model/layers/activation.h"

namespace model {

void Activation::plan(ActivationPlan& plan, int64_t n) {
  dpre_ = plan.shared_unless_bf16("mlp.dpre", n);
  dpre_bf16_ = plan.shared_bf16("mlp.dpre_bf16", n);
}

void Activation::forward(Context& ctx, float* out, core::bf16* out_bf16, const float* pre,
                         int64_t n) const {
  core::Backend& be = ctx.backend;
  if (out_bf16 && gelu_) {
    be.gelu_forward(out_bf16, pre, n);
  } else if (out_bf16) {
    be.relu2_forward(out_bf16, pre, n);
  } else if (gelu_) {
    be.gelu_forward(out, pre, n);
  } else {
    be.relu2_forward(out, pre, n);
  }
}

Operand Activation::backward(Context& ctx, const float* pre, const float* dout, int64_t n) const {
  core::Backend& be = ctx.backend;
  if (dpre_bf16_) {
    if (gelu_) {
      be.gelu_backward(dpre_bf16_, pre, dout, n);
    } else {
      be.relu2_backward(dpre_bf16_, pre, dout, n);
    }
    return {nullptr, dpre_bf16_};
  }
  be.fill_zero(dpre_, n * sizeof(float));
  if (gelu_) {
    be.gelu_backward(dpre_, pre, dout, n);
  } else {
    be.relu2_backward(dpre_, pre, dout, n);
  }
  return {dpre_, nullptr};
}

}  // namespace model
