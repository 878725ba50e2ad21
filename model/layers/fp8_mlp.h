// model.mlp_fp8: record #89's MLP forward in FP8 in training (train_gpt.py:1403-1435 and
// 1643-1676; triton_kernels.py's linear_relu_square with FP8 operands,
// quantize_transpose_mlp_down_weights and reduce_mlp_activation_scales). Per block:
//   pre = (s_x s_fc) Xq FCq^T,  Xq = e4m3(ln2 / s_x),  FCq = e4m3(fc / s_fc),
//         s_x = amax(ln2) / 448 (dynamic, this forward's), s_fc = amax(fc) / 448 (per block);
//   act = relu(pre)^2 as without FP8 (f32, or bf16 in bf16 precision);
//   y   = (s_a s_p) Aq Pq^T,  Aq = e4m3(act / s_a),  Pq = e4m3(proj / s_p),
//         s_a = the previous training forward's amax(act) x 1.80 / 448 on this rank (1 at the
//         start), s_p = the previous step's amax(proj) x 1.12 / 448, from step 17 on; through
//         step 16 (the record's bootstrap_down=(step < 16) after each step, and at the start) the
//         weights' own amax / 448;
//   out = x + y (bf16 precision: y rounded to bf16 first, as _scaled_mm's bf16 output).
// Every rounding is kmath::fp8_value: nearest even, saturating at 448 (the record's kernels clamp
// the activation and proj to +-448 before their casts; its casts of ln2, compiled and saturating,
// and fc, eager and NaN above 464, divide by their own amax and pass 448 by at most a bf16 step,
// which rounds back to 448), both GEMMs with FP8 fast accumulation (the down projection's
// _scaled_mm use_fast_accum=True; Triton's FP8 tl.dot on sm_90), f32 outputs.
// The backward is Mlp's: the gradient of the unquantised MLP at this forward's pre and act (the
// record's FusedLinearReLUSquareFunction saves x, W1, W2 and post, never their FP8 copies).
// Evaluation runs the unquantised MLP and leaves the scales alone.
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "model/layers/mlp.h"

namespace model {

// The FP8 MLPs' scales, one row per block in the backend's memory: the activation's delayed scale
// (for the next training forward), the projection's scale of this step and its delayed scale for
// the next step; and per block the step whose scale was last taken (host).
class Fp8MlpScales {
 public:
  static constexpr float kActHeadroom = 1.80f, kProjHeadroom = 1.12f;
  // The projection's scale is its own amax / 448 while the parameters have had at most this many
  // optimizer steps.
  static constexpr int64_t kBootstrapSteps = 16;

  Fp8MlpScales(int n_layer, core::Backend& backend);

  float* act(int block) { return row(block); }
  float* proj(int block) { return row(block) + 1; }
  float* proj_next(int block) { return row(block) + 2; }
  // Three floats of scratch: an amax, the input's scale, fc's scale.
  float* scratch(int block) { return row(block) + 3; }
  // The constant 1 (the residual add's weight of y).
  const float* one() { return row(n_layer_); }

  // The optimizer steps the parameters have had (Gpt::set_weights_step).
  void set_weights_step(int64_t step) { step_ = step; }
  bool bootstrap() const { return step_ <= kBootstrapSteps; }
  // Whether block's projection scale is taken anew (its first training forward of this step);
  // marks it taken.
  bool advance(int block);

  // The persistent scales, host floats [n_layer x 3] (act, proj, proj_next per block): what a
  // checkpoint saves and the trainer's warm-up restores. set_values takes them back and makes
  // every block take its projection scale anew at its next training forward.
  std::vector<float> values() const;
  void set_values(const std::vector<float>& values);

 private:
  static constexpr int kRow = 6;  // the table: a row per block, then the constant 1
  float* row(int block) { return table_.data<float>() + int64_t(block) * kRow; }
  core::Backend& backend_;
  int n_layer_;
  core::Tensor table_;
  std::vector<int64_t> taken_step_;
  int64_t step_ = 0;
};

class Fp8Mlp : public Mlp {
 public:
  // `branch` as Mlp's (model.sublayer_lambdas, model.mudd: the output alone, the input a tap's).
  Fp8Mlp(Context& ctx, int block, Fp8MlpScales& scales, BranchWiring branch = {});
  void plan(ActivationPlan& plan, const Context& ctx) override;
  Stream forward(Context& ctx, Stream x) override;

 private:
  // out = e4m3(in / s) with s = amax(in) / 448 written to *scale (amax through *amax).
  void encode_dynamic(Context& ctx, core::fp8* out, Operand in, int64_t n, float* amax,
                      float* scale) const;
  int block_;
  Fp8MlpScales& scales_;
  // The GEMM operands as FP8 bytes (shared by the blocks: forward only) and y = the down GEMM's
  // f32 output (with its bf16 rounding in bf16 precision).
  core::fp8 *xq_ = nullptr, *fcq_ = nullptr, *actq_ = nullptr, *projq_ = nullptr;
  float* y_ = nullptr;
  core::bf16* y_bf16_ = nullptr;
};

}  // namespace model
