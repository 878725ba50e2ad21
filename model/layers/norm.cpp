#include "model/layers/norm.h"

#include "core/check.h"

namespace model {

namespace {

constexpr float kLayerNormEps = 1e-5f;

}  // namespace

Norm::Norm(const ModelConfig& config, size_t weight, size_t bias)
    : layer_norm_(config.arch == Arch::Gpt2),
      eps_(layer_norm_ ? kLayerNormEps : config.norm_eps),
      weight_(weight),
      bias_(bias) {}

void Norm::plan(ActivationPlan& plan, const Context& ctx) {
  const int64_t N = ctx.N(), D = ctx.config.d_model;
  out_ = plan.f32_unless_bf16(N * D);
  out_bf16_ = plan.bf16(N * D);
  mean_ = plan.f32(N);
  rstd_ = plan.f32(N);
}

void Norm::forward(Context& ctx, Stream inp) {
  core::Backend& be = ctx.backend;
  const int64_t N = ctx.N(), D = ctx.config.d_model;
  const float* w = ctx.params.value(weight_);
  const float* b = ctx.params.value(bias_);
  // bf16 precision: the bf16 stream in, the bf16 GEMM input out.
  if (inp.bf16) {
    ENGINE_CHECK(out_bf16_, "model: a norm of the bf16 residual stream stores a bf16 output");
    if (layer_norm_) {
      be.layernorm_forward(out_bf16_, mean_, rstd_, inp.bf16, w, b, N, D, eps_);
    } else {
      be.rmsnorm_forward(out_bf16_, rstd_, inp.bf16, N, D, eps_);
    }
  } else if (layer_norm_) {
    be.layernorm_forward(out_, mean_, rstd_, inp.f32, w, b, N, D, eps_);
  } else {
    be.rmsnorm_forward(out_, rstd_, inp.f32, N, D, eps_);
  }
}

void Norm::backward(Context& ctx, float* dinp, const float* dout, Stream inp) {
  core::Backend& be = ctx.backend;
  const int64_t N = ctx.N(), D = ctx.config.d_model;
  if (layer_norm_) {
    float* dw = ctx.params.grad_of(weight_);
    float* db = ctx.params.grad_of(bias_);
    const float* w = ctx.params.value(weight_);
    if (inp.bf16) {
      be.layernorm_backward(dinp, dw, db, dout, inp.bf16, w, mean_, rstd_, N, D);
    } else {
      be.layernorm_backward(dinp, dw, db, dout, inp.f32, w, mean_, rstd_, N, D);
    }
  } else if (inp.bf16) {
    be.rmsnorm_backward(dinp, dout, inp.bf16, rstd_, N, D);
  } else {
    be.rmsnorm_backward(dinp, dout, inp.f32, rstd_, N, D);
  }
}

}  // namespace model
