#include "model/layers/fp8_mlp.h"

#include "core/check.h"
#include "core/kernel_math.h"

namespace model {

namespace {

using core::kmath::Fp8;

constexpr float kE4m3Max = 448.0f;

}  // namespace

Fp8MlpScales::Fp8MlpScales(int n_layer, core::Backend& backend)
    : backend_(backend),
      n_layer_(n_layer),
      table_(core::Tensor::empty({int64_t(n_layer) * kRow + 1}, core::DType::F32,
                                 backend.allocator())),
      taken_step_(static_cast<size_t>(n_layer), -1) {
  set_values(std::vector<float>(static_cast<size_t>(n_layer) * 3, 1.0f));
}

bool Fp8MlpScales::advance(int block) {
  int64_t& taken = taken_step_.at(static_cast<size_t>(block));
  if (taken == step_) return false;
  taken = step_;
  return true;
}

std::vector<float> Fp8MlpScales::values() const {
  std::vector<float> table(static_cast<size_t>(n_layer_) * kRow);
  backend_.copy_to_host(table.data(), table_.raw_data(), table.size() * sizeof(float));
  std::vector<float> v;
  for (int l = 0; l < n_layer_; ++l)
    for (int j = 0; j < 3; ++j)
      v.push_back(table[static_cast<size_t>(l * kRow + j)]);
  return v;
}

void Fp8MlpScales::set_values(const std::vector<float>& values) {
  ENGINE_CHECK(values.size() == static_cast<size_t>(n_layer_) * 3,
               "FP8 MLP scales: " + std::to_string(values.size()) + " values for " +
                   std::to_string(n_layer_) + " blocks (3 each: act, proj, proj_next)");
  std::vector<float> table(static_cast<size_t>(n_layer_) * kRow + 1, 1.0f);
  for (int l = 0; l < n_layer_; ++l)
    for (int j = 0; j < 3; ++j)
      table[static_cast<size_t>(l * kRow + j)] = values[static_cast<size_t>(l * 3 + j)];
  backend_.copy_from_host(table_.raw_data(), table.data(), table.size() * sizeof(float));
  for (int64_t& taken : taken_step_)
    taken = -1;
}

Fp8Mlp::Fp8Mlp(Context& ctx, int block, Fp8MlpScales& scales, BranchWiring branch)
    : Mlp(ctx, block, branch), block_(block), scales_(scales) {
  ENGINE_CHECK(!act_.gelu() && fc_b_ == kNoParam && proj_b_ == kNoParam,
               "model.mlp_fp8: the FP8 MLP is the modern block's (ReLU^2, no biases)");
}

void Fp8Mlp::plan(ActivationPlan& plan, const Context& ctx) {
  Mlp::plan(plan, ctx);
  const int64_t N = ctx.N(), D = ctx.config.d_model, F = ctx.config.d_ff();
  auto bytes = [&](const char* name, int64_t n) {
    return reinterpret_cast<core::fp8*>(plan.shared(name, (n + 3) / 4));
  };
  xq_ = bytes("fp8_mlp.xq", N * D);
  fcq_ = bytes("fp8_mlp.fcq", F * D);
  actq_ = bytes("fp8_mlp.actq", N * F);
  projq_ = bytes("fp8_mlp.projq", D * F);
  y_ = plan.shared("fp8_mlp.y", N * D);
  y_bf16_ = plan.shared_bf16("fp8_mlp.y_bf16", N * D);
}

void Fp8Mlp::encode_dynamic(Context& ctx, core::fp8* out, Operand in, int64_t n, float* amax,
                            float* scale) const {
  core::Backend& be = ctx.backend;
  if (in.bf16) {
    be.abs_max(amax, in.bf16, n);
    be.fp8_scale_from_amax(scale, amax, 1, 1.0f / kE4m3Max);
    be.fp8_encode_scaled(out, in.bf16, n, scale, Fp8::E4M3);
  } else {
    be.abs_max(amax, in.f32, n);
    be.fp8_scale_from_amax(scale, amax, 1, 1.0f / kE4m3Max);
    be.fp8_encode_scaled(out, in.f32, n, scale, Fp8::E4M3);
  }
}

Stream Fp8Mlp::forward(Context& ctx, Stream x) {
  if (!ctx.want_grad) return Mlp::forward(ctx, x);  // evaluation: the unquantised MLP
  const int64_t N = ctx.N(), D = ctx.config.d_model, F = ctx.config.d_ff();
  core::Backend& be = ctx.backend;
  in_ = branch_.input ? branch_.input->stream() : x;
  norm_.forward(ctx, in_);
  float* amax = scales_.scratch(block_);
  float* x_scale = amax + 1;
  float* fc_scale = amax + 2;

  // Up: pre = (s_x s_fc) Xq FCq^T with this forward's scales.
  encode_dynamic(ctx, xq_, norm_.out(), N * D, amax, x_scale);
  encode_dynamic(ctx, fcq_, ctx.params.weight(fc_w_), F * D, amax, fc_scale);
  core::GemmArgs up;
  up.trans_b = true;
  up.m = N, up.n = F, up.k = D;
  up.fp8_fast_accum = true;
  be.gemm_fp8_scaled(up, xq_, Fp8::E4M3, x_scale, fcq_, Fp8::E4M3, fc_scale, pre_);
  act_.forward(ctx, act_f32_, act_bf16_, pre_, N * F);

  // Down: the activation over its delayed scale (saturating), the projection over this step's.
  float* act_scale = scales_.act(block_);
  float* proj_scale = scales_.proj(block_);
  float* proj_next = scales_.proj_next(block_);
  const Operand act{act_f32_, act_bf16_};
  if (act.bf16) {
    be.fp8_encode_scaled(actq_, act.bf16, N * F, act_scale, Fp8::E4M3);
  } else {
    be.fp8_encode_scaled(actq_, act.f32, N * F, act_scale, Fp8::E4M3);
  }
  const Operand proj = ctx.params.weight(proj_w_);
  if (scales_.advance(block_)) {
    // The step's first training forward: this step's scale, then the next step's from this
    // step's weights (quantize_mlp_fp8).
    if (proj.bf16) {
      be.abs_max(amax, proj.bf16, D * F);
    } else {
      be.abs_max(amax, proj.f32, D * F);
    }
    if (scales_.bootstrap()) {
      be.fp8_scale_from_amax(proj_scale, amax, 1, 1.0f / kE4m3Max);
    } else {
      be.copy(proj_scale, proj_next, sizeof(float));
    }
    be.fp8_scale_from_amax(proj_next, amax, 1, Fp8MlpScales::kProjHeadroom / kE4m3Max);
  }
  if (proj.bf16) {
    be.fp8_encode_scaled(projq_, proj.bf16, D * F, proj_scale, Fp8::E4M3);
  } else {
    be.fp8_encode_scaled(projq_, proj.f32, D * F, proj_scale, Fp8::E4M3);
  }
  core::GemmArgs down;
  down.trans_b = true;
  down.m = N, down.n = D, down.k = F;
  down.fp8_fast_accum = true;
  be.gemm_fp8_scaled(down, actq_, Fp8::E4M3, act_scale, projq_, Fp8::E4M3, proj_scale, y_);
  // The next training forward's activation scale, from this one's amax.
  if (act.bf16) {
    be.abs_max(amax, act.bf16, N * F);
  } else {
    be.abs_max(amax, act.f32, N * F);
  }
  be.fp8_scale_from_amax(act_scale, amax, 1, Fp8MlpScales::kActHeadroom / kE4m3Max);

  // out = x + y (a branch alone: y); in bf16 precision y is rounded to bf16 first (_scaled_mm's
  // bf16 output).
  Stream y{y_, nullptr};
  if (y_bf16_) {
    be.f32_to_bf16(y_bf16_, y_, N * D);
    y = {nullptr, y_bf16_};
  }
  if (branch_.alone) {
    mix_stream(be, out_, nullptr, y, nullptr, Stream{}, N * D);
  } else {
    mix_stream(be, out_, nullptr, x, scales_.one(), y, N * D);
  }
  return out_;
}

}  // namespace model
