#include "model/layers/moe.h"

#include <string>

namespace model {

Moe::Moe(Context& ctx, int block)
    : block_(block),
      norm_(ctx.config, ctx.params.find("blocks." + std::to_string(block) + ".ln2.weight"),
            ctx.params.find("blocks." + std::to_string(block) + ".ln2.bias")),
      act_(ctx.config) {
  const std::string p = "blocks." + std::to_string(block) + ".moe.";
  router_w_ = ctx.params.index(p + "router.weight");
  fc_w_ = ctx.params.index(p + "fc.weight");
  proj_w_ = ctx.params.index(p + "proj.weight");
  ctx.params.use_in_bf16_gemm(fc_w_);
  ctx.params.use_in_bf16_gemm(proj_w_);
}

void Moe::plan(ActivationPlan& plan, const Context& ctx) {
  const ModelConfig& c = ctx.config;
  const int64_t N = ctx.N(), D = c.d_model, F = c.d_ff(), E = c.moe_experts, K = c.moe_top_k,
                M = N * K;
  norm_.plan(plan, ctx);
  probs_ = plan.f32(N * E);
  xe_ = plan.f32_unless_bf16(M * D);
  xe_bf16_ = plan.bf16(M * D);
  pre_ = plan.f32(M * F);
  act_f32_ = plan.f32_unless_bf16(M * F);
  act_bf16_ = plan.bf16(M * F);
  ye_ = plan.f32(M * D);
  core::MoeRouting& r = route_;
  r.chosen = plan.i32(M);
  r.slot_row = plan.i32(M);
  r.row_token = plan.i32(M);
  r.row_gate = plan.f32(M);
  r.sel_sum = plan.f32(N);
  r.frac = plan.f32(E);
  r.offset = plan.i32(E + 1);
  r.mass = reinterpret_cast<double*>(plan.f32(2 * E));
  out_ = plan.stream(N * D);
  act_.plan(plan, M * F);
  dact_ = plan.shared("mlp.dact", M * F);
  // The GEMMs' rounding of the rows' f32 output gradients (model/linear.h) takes M rows.
  plan.shared_bf16("linear.dy_bf16", M * D);
  dxe_raw_ = plan.shared("moe.dxe_raw", M * D);
  dye_ = plan.shared("moe.dye", M * D);
  dxe_ = plan.shared("moe.dxe", M * D);
  dgate_ = plan.shared("moe.dgate", M);
  dprobs_ = plan.shared("moe.dprobs", N * E);
  drouter_ = plan.shared("moe.drouter", N * E);
  router_in_ = plan.bf16_precision() ? plan.shared("moe.router_in", N * D) : nullptr;
}

const float* Moe::router_input(Context& ctx) {
  const Operand x = norm_.out();
  if (!x.bf16) return x.f32;
  ctx.backend.bf16_to_f32(router_in_, x.bf16, ctx.N() * ctx.config.d_model);
  return router_in_;
}

Stream Moe::forward(Context& ctx, Stream x) {
  core::Backend& be = ctx.backend;
  const ModelConfig& c = ctx.config;
  const int64_t N = ctx.N(), D = c.d_model, F = c.d_ff(), E = c.moe_experts, K = c.moe_top_k,
                M = N * K;
  const core::MoeRouting& r = route_;
  in_ = x;
  norm_.forward(ctx, x);

  // Router probabilities, then top-k, gates, dispatch rows and the aux loss on the device.
  ctx.linear.forward(probs_, {router_input(ctx), nullptr}, ctx.params.weight(router_w_), N, D, E);
  be.softmax_forward(probs_, probs_, N, E);
  be.moe_route(r, ctx.losses + 1, probs_, N, E, K, c.moe_aux_weight);
  // The per-expert GEMMs take their row counts on the host: the one read of a layer's routing
  // (E + 1 offsets), kept for the backward.
  offset_.resize(E + 1);
  be.copy_to_host(offset_.data(), r.offset, (E + 1) * sizeof(int32_t));
  ctx.expert_rows.resize(static_cast<size_t>(c.n_layer * E));
  for (int64_t e = 0; e < E; ++e)
    ctx.expert_rows[block_ * E + e] += offset_[e + 1] - offset_[e];

  // Dispatch, one pair of GEMMs per expert over its contiguous rows, combine.
  const Operand ln = norm_.out();
  if (xe_bf16_) {
    be.gather_rows(xe_bf16_, ln.bf16, r.row_token, M, D);
  } else {
    be.gather_rows(xe_, ln.f32, r.row_token, nullptr, M, D);
  }
  const Operand xe{xe_, xe_bf16_};
  const Operand fc = ctx.params.weight(fc_w_);
  const Operand proj = ctx.params.weight(proj_w_);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = offset_[e], n = offset_[e + 1] - r0;
    if (n == 0) continue;
    ctx.linear.forward(pre_ + r0 * F, xe.at(r0 * D), fc.at(e * F * D), n, D, F);
  }
  act_.forward(ctx, act_f32_, act_bf16_, pre_, M * F);
  const Operand act{act_f32_, act_bf16_};
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = offset_[e], n = offset_[e + 1] - r0;
    if (n == 0) continue;
    ctx.linear.forward(ye_ + r0 * D, act.at(r0 * F), proj.at(e * D * F), n, F, D);
  }
  if (out_.bf16) {
    // The bf16 stream: x plus each token's gated rows in f32, rounded once.
    be.combine_rows(out_.bf16, x.bf16, ye_, r.slot_row, r.row_gate, N, K, D);
  } else {
    be.copy(out_.f32, x.f32, N * D * sizeof(float));
    be.scatter_add_rows(out_.f32, ye_, r.row_token, r.row_gate, M, D);
  }
  return out_;
}

void Moe::backward(Context& ctx) {
  core::Backend& be = ctx.backend;
  const ModelConfig& c = ctx.config;
  const int64_t N = ctx.N(), D = c.d_model, F = c.d_ff(), E = c.moe_experts, K = c.moe_top_k,
                M = N * K;
  const core::MoeRouting& r = route_;

  // d gate of each row = <dout[token], y_row>; d y_row = gate * dout[token].
  be.gather_rows(dxe_raw_, ctx.dres, r.row_token, nullptr, M, D);
  be.row_dot(dgate_, dxe_raw_, ye_, M, D);
  be.gather_rows(dye_, ctx.dres, r.row_token, r.row_gate, M, D);
  const Operand fc = ctx.params.weight(fc_w_);
  const Operand proj = ctx.params.weight(proj_w_);
  const Operand xe{xe_, xe_bf16_}, act{act_f32_, act_bf16_};
  float* dfc = ctx.params.grad_of(fc_w_);
  float* dproj = ctx.params.grad_of(proj_w_);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = offset_[e], n = offset_[e + 1] - r0;
    if (n == 0) continue;
    ctx.linear.backward(dact_ + r0 * F, dproj + e * D * F, dye_ + r0 * D, act.at(r0 * F),
                        proj.at(e * D * F), n, F, D, 0.0f);
  }
  const Operand dpre = act_.backward(ctx, pre_, dact_, M * F);
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r0 = offset_[e], n = offset_[e + 1] - r0;
    if (n == 0) continue;
    const Operand dy = dpre.at(r0 * F);
    ctx.linear.backward(dxe_ + r0 * D, dfc + e * F * D, dy.f32, xe.at(r0 * D), fc.at(e * F * D), n,
                        D, F, 0.0f, dy.bf16);
  }
  be.fill_zero(ctx.dln, N * D * sizeof(float));
  be.scatter_add_rows(ctx.dln, dxe_, r.row_token, nullptr, M, D);

  // Router: through the renormalised gates and the aux loss into d probs, then the softmax.
  be.fill_zero(dprobs_, N * E * sizeof(float));
  be.moe_router_backward(dprobs_, r, dgate_, N, E, K, c.moe_aux_weight);
  be.fill_zero(drouter_, N * E * sizeof(float));
  be.softmax_backward(drouter_, dprobs_, probs_, N, E);
  ctx.linear.backward(ctx.dln, ctx.params.grad_of(router_w_), drouter_,
                      {router_input(ctx), nullptr}, ctx.params.weight(router_w_), N, D, E, 1.0f);
  norm_.backward(ctx, ctx.dres, ctx.dln, in_);
}

}  // namespace model
