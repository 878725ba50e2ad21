#include "model/layers/lm_head.h"

#include <vector>

#include "core/check.h"
#include "core/kernel_math.h"

namespace model {

LmHead::LmHead(Context& ctx)
    : norm_(ctx.config, ctx.params.find("ln_f.weight"), ctx.params.find("ln_f.bias")),
      cap_(ctx.config),
      head_(ctx.config.arch == Arch::Gpt2 ? ctx.params.index("embed.weight")
                                          : ctx.params.index("lm_head.weight")) {
  ctx.params.use_in_bf16_gemm(head_);
}

bool LmHead::bf16_logits(const Context& ctx) const {
  return ctx.config.precision == Precision::Bf16;
}

void LmHead::plan(ActivationPlan& plan, const Context& ctx) {
  const int64_t N = ctx.N(), B = ctx.B, D = ctx.config.d_model, Vp = ctx.config.padded_vocab();
  norm_.plan(plan, ctx);
  const bool bf16 = bf16_logits(ctx);
  logits_ = bf16 ? nullptr : plan.f32(N * Vp);
  logits_bf16_ = bf16 ? plan.bf16(N * Vp) : nullptr;
  losses_ = plan.f32(N);
  cap_bias_ = cap_.bias() != 0.0f ? plan.f32(Vp) : nullptr;
  last_index_ = plan.i32(B);
  last_hidden_ = plan.f32_unless_bf16(B * D);
  last_hidden_bf16_ = plan.bf16(B * D);
  last_logits_ = bf16 ? nullptr : plan.f32(B * Vp);
  last_logits_bf16_ = bf16 ? plan.bf16(B * Vp) : nullptr;
}

float LmHead::dlogits_scale(const Context& ctx, float gain) const {
  return gain / static_cast<float>(ctx.N());
}

void LmHead::logits_forward(Context& ctx, float gain) {
  const int64_t N = ctx.N(), D = ctx.config.d_model, Vp = ctx.config.padded_vocab();
  if (logits_bf16_) {
    ctx.linear.forward(logits_bf16_, norm_.out(), ctx.params.weight(head_), N, D, Vp, gain);
  } else {
    ctx.linear.forward(logits_, norm_.out(), ctx.params.weight(head_), N, D, Vp, 0.0f, gain);
  }
}

Stream LmHead::forward(Context& ctx, Stream x) {
  in_ = x;
  norm_.forward(ctx, x);
  if (!ctx.targets) return x;
  const int64_t N = ctx.N(), Vp = ctx.config.padded_vocab(), Vs = ctx.config.softmax_vocab();
  // The logits enter the loss times the cap's gain (1 but for the sigmoid form), so d loss / d z
  // is the gain times the loss kernel's gradient: it goes into the kernel's scale.
  const float gain = cap_.gain();
  logits_forward(ctx, gain);
  if (cap_bias_) {
    // The sigmoid cap's offset: the loss kernel takes gain (z + b) (validate() keeps the logits
    // f32 here); the logits' gradient is unchanged.
    ENGINE_CHECK(logits_, "model.softcap_offset: the logits are stored in bf16");
    const std::vector<float> bias(static_cast<size_t>(Vp), cap_.bias());
    ctx.backend.copy_from_host(cap_bias_, bias.data(), bias.size() * sizeof(float));
    ctx.backend.add_bias(logits_, cap_bias_, N, Vp);
  }
  // With want_grad the fused loss also overwrites the logits with d loss / d logits. Training
  // takes the loss's terms (multi-token and prefix targets), evaluation the plain cross-entropy.
  const float scale = dlogits_scale(ctx, gain);
  core::kmath::LossTerms terms = ctx.want_grad ? ctx.loss_terms : core::kmath::LossTerms{};
  terms.row_tokens = ctx.T;
  if (logits_bf16_) {
    ctx.backend.cross_entropy(losses_, ctx.want_grad ? logits_bf16_ : nullptr, logits_bf16_,
                              ctx.targets, N, Vs, Vp, cap_.tanh_cap(), scale, terms);
  } else {
    ctx.backend.cross_entropy(losses_, ctx.want_grad ? logits_ : nullptr, logits_, ctx.targets, N,
                              Vs, Vp, cap_.tanh_cap(), scale, terms);
  }
  ctx.backend.mean_loss(ctx.losses, losses_, N);
  return x;
}

void LmHead::logits_backward(Context& ctx) {
  const int64_t N = ctx.N(), D = ctx.config.d_model, Vp = ctx.config.padded_vocab();
  // The logits' buffer holds d loss / d logits (zero in the padded columns, so padded head rows
  // get none).
  ctx.linear.backward(ctx.dln, ctx.params.grad_of(head_), logits_, norm_.out(),
                      ctx.params.weight(head_), N, D, Vp, 0.0f, logits_bf16_);
}

void LmHead::backward(Context& ctx) {
  logits_backward(ctx);
  norm_.backward(ctx, ctx.dres, ctx.dln, in_);
}

std::vector<float> LmHead::last_logits(Context& ctx) {
  const int B = ctx.B, T = ctx.T;
  const int64_t D = ctx.config.d_model, V = ctx.config.vocab_size, Vp = ctx.config.padded_vocab();
  core::Backend& be = ctx.backend;
  std::vector<int32_t> last(B);
  for (int b = 0; b < B; ++b)
    last[b] = b * T + T - 1;
  be.copy_from_host(last_index_, last.data(), B * sizeof(int32_t));
  const Operand lnf = norm_.out();
  if (lnf.bf16) {
    be.gather_rows(last_hidden_bf16_, lnf.bf16, last_index_, B, D);
  } else {
    be.gather_rows(last_hidden_, lnf.f32, last_index_, nullptr, B, D);
  }
  std::vector<float> padded(B * Vp);
  const Operand hidden{last_hidden_, last_hidden_bf16_};
  if (last_logits_bf16_) {
    // The logits the loss reads in bf16 precision: gain z rounded once (the loss's head GEMM),
    // widened here and the gain taken off again.
    const float gain = cap_.gain();
    ctx.linear.forward(last_logits_bf16_, hidden, ctx.params.weight(head_), B, D, Vp, gain);
    std::vector<core::bf16> rounded(padded.size());
    be.copy_to_host(rounded.data(), last_logits_bf16_, rounded.size() * sizeof(core::bf16));
    for (size_t i = 0; i < padded.size(); ++i)
      padded[i] = core::kmath::float_from_bf16(rounded[i]) / gain;
  } else {
    ctx.linear.forward(last_logits_, hidden, ctx.params.weight(head_), B, D, Vp);
    be.copy_to_host(padded.data(), last_logits_, padded.size() * sizeof(float));
  }
  std::vector<float> out(B * V);
  for (int b = 0; b < B; ++b)
    for (int64_t v = 0; v < V; ++v)
      out[b * V + v] = cap_.apply(padded[b * Vp + v]);
  return out;
}

}  // namespace model
