#include "model/layers/mlp.h"

#include <string>

#include "core/check.h"

namespace model {

Mlp::Mlp(Context& ctx, int block, BranchWiring branch)
    : branch_(branch),
      norm_(ctx.config, ctx.params.find("blocks." + std::to_string(block) + ".ln2.weight"),
            ctx.params.find("blocks." + std::to_string(block) + ".ln2.bias")),
      act_(ctx.config) {
  const std::string p = "blocks." + std::to_string(block) + ".mlp.";
  fc_w_ = ctx.params.index(p + "fc.weight");
  fc_b_ = ctx.params.find(p + "fc.bias");
  proj_w_ = ctx.params.index(p + "proj.weight");
  proj_b_ = ctx.params.find(p + "proj.bias");
  ctx.params.use_in_bf16_gemm(fc_w_);
  ctx.params.use_in_bf16_gemm(proj_w_);
  ENGINE_CHECK(!branch.alone || proj_b_ == kNoParam,
               "MLP: a branch alone (block " + std::to_string(block) + ") takes no bias");
}

void Mlp::plan(ActivationPlan& plan, const Context& ctx) {
  const int64_t N = ctx.N(), D = ctx.config.d_model, F = ctx.config.d_ff();
  norm_.plan(plan, ctx);
  pre_ = plan.f32(N * F);
  act_f32_ = plan.f32_unless_bf16(N * F);
  act_bf16_ = plan.bf16(N * F);
  out_ = plan.stream(N * D);
  act_.plan(plan, N * F);
  dact_ = plan.shared("mlp.dact", N * F);
}

Stream Mlp::forward(Context& ctx, Stream x) {
  const int64_t N = ctx.N(), D = ctx.config.d_model, F = ctx.config.d_ff();
  in_ = branch_.input ? branch_.input->stream() : x;
  norm_.forward(ctx, in_);
  const float* fc_b = ctx.params.value(fc_b_);
  if (fused_gelu()) {
    // pre = ln2 fc^T + b and act = gelu(pre) in the GEMM's epilogue.
    ctx.linear.forward_epilogue(pre_, norm_.out(), ctx.params.weight(fc_w_), fc_b, N, D, F, nullptr,
                                act_f32_);
  } else {
    ctx.linear.forward_epilogue(pre_, norm_.out(), ctx.params.weight(fc_w_), fc_b, N, D, F);
    act_.forward(ctx, act_f32_, act_bf16_, pre_, N * F);
  }
  const Operand act{act_f32_, act_bf16_};
  if (branch_.alone) {
    // y = act @ proj^T (+ bias) by itself.
    if (out_.bf16) {
      ctx.linear.forward(out_.bf16, act, ctx.params.weight(proj_w_), N, F, D, 1.0f);
    } else {
      ctx.linear.forward_epilogue(out_.f32, act, ctx.params.weight(proj_w_),
                                  ctx.params.value(proj_b_), N, F, D);
    }
    return out_;
  }
  // res_out = x + act @ proj^T (+ bias): the residual add as the GEMM's C.
  ctx.linear.residual_forward(out_, act, ctx.params.weight(proj_w_), ctx.params.value(proj_b_), N,
                              F, D, x);
  return out_;
}

void Mlp::backward(Context& ctx) {
  const int64_t N = ctx.N(), D = ctx.config.d_model, F = ctx.config.d_ff();
  const Operand act{act_f32_, act_bf16_};
  Operand dpre;
  if (fused_gelu()) {
    // d pre = gelu'(pre) (dres proj) in the GEMM's epilogue.
    ctx.linear.backward(act_.dpre(), ctx.params.grad_of(proj_w_), ctx.dres, act,
                        ctx.params.weight(proj_w_), N, F, D, 0.0f, nullptr,
                        ctx.params.grad_of(proj_b_), pre_);
    dpre = {act_.dpre(), nullptr};
  } else {
    ctx.linear.backward(dact_, ctx.params.grad_of(proj_w_), ctx.dres, act,
                        ctx.params.weight(proj_w_), N, F, D, 0.0f, nullptr,
                        ctx.params.grad_of(proj_b_));
    dpre = act_.backward(ctx, pre_, dact_, N * F);
  }
  ctx.linear.backward(ctx.dln, ctx.params.grad_of(fc_w_), dpre.f32, norm_.out(),
                      ctx.params.weight(fc_w_), N, D, F, 0.0f, dpre.bf16,
                      ctx.params.grad_of(fc_b_));
  // dres: d/d res_out; the norm adds its path into it (= d/d x). Alone, the chain's stream
  // reaches the output only through the branch's input (if at all).
  if (branch_.alone) ctx.backend.fill_zero(ctx.dres, N * D * sizeof(float));
  norm_.backward(ctx, branch_.input ? branch_.input->grad() : ctx.dres, ctx.dln, in_);
}

}  // namespace model
