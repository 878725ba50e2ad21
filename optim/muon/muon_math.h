// Muon's element math (NorMuon's normalisation, the cautious update), shared by its CPU and CUDA
// ops (muon_ops.h). The stored values are float, the arithmetic float64, in the operation order
// the golden replays were recorded with.
#pragma once

#include <cmath>

#include "core/kernel_math.h"

namespace optim::kmath {

// NorMuon normalisation of one orthogonalised update V [rows, cols]: with one statistic per row
// (rows >= cols) or per column, q_a the sum of squares of row (column) a over its `count`
// entries and s_a the stored second moment,
//   s_a <- b2 s_a + (1 - b2) q_a / count,   scale_a = 1 / sqrt(max(s_a, 1e-10)),
//   V   <- V * scale (per row or column) * ||V||_F / max(||V * scale||_F, 1e-10),
// so the update keeps its Frobenius norm and only its distribution over rows (columns) changes.
ENGINE_HD inline double normuon_second_moment(double s, double q, double count, double beta2) {
  return beta2 * s + (1.0 - beta2) * (q / count);
}
ENGINE_HD inline double normuon_scale(double second_moment) {
  return 1.0 / std::sqrt(second_moment < 1e-10 ? 1e-10 : second_moment);
}
// ||V||_F / max(||V * scale||_F, 1e-10) from the two squared norms.
ENGINE_HD inline double normuon_keep_norm(double norm2, double scaled2) {
  const double scaled = std::sqrt(scaled2);
  return std::sqrt(norm2) / (scaled < 1e-10 ? 1e-10 : scaled);
}
ENGINE_HD inline float normuon_apply(float v, double scale, double keep_norm) {
  return static_cast<float>(v * scale * keep_norm);
}

// The Muon parameter update with cautious weight decay: w <- w - lr (wd [u w >= 0] w + u); the
// decay acts only where it agrees in sign with the update (wd = 0: the plain update).
ENGINE_HD inline float cautious_update_element(float w, float u, double lr, double wd) {
  const double wi = w, ui = u;
  const double mask = ui * wi >= 0 ? 1.0 : 0.0;
  return static_cast<float>(wi - lr * (wd * mask * wi + ui));
}

// The bfloat16 Newton-Schulz iteration (NewtonSchulzSchedule::bf16): each tensor op computes in
// float and stores bf16, so every result is rounded once, r(v) = float(bf16(v)).
ENGINE_HD inline float ns_round(float v) {
  return core::kmath::float_from_bf16(core::kmath::bf16_from_float(v));
}
// r(s x): a coefficient times a stored value (the coefficient in float, as CUDA multiplies a
// bf16 tensor by a Python scalar).
ENGINE_HD inline float ns_bf16_scale(float s, float x) {
  return ns_round(s * x);
}
// r(r(s x) + r(p)): the record's B = b A + (c A) A and X' = a X + B X, with p the GEMM's f32 sum,
// as eager PyTorch runs them (each tensor op rounds its result).
ENGINE_HD inline float ns_bf16_axpy(float s, float x, float p) {
  return ns_round(ns_round(s * x) + ns_round(p));
}
// r(s x + r(p)): the same as the record runs them, its zeropower_via_newtonschulz5 compiled
// (torch.compile): Inductor fuses s x + P into one kernel that reads the stored bf16 x and P (the
// GEMM's output, r(p)), computes in f32 and rounds once; the multiply and the add contracted to
// one fused multiply-add, as Triton does by default (enable_fp_fusion).
ENGINE_HD inline float ns_bf16_fused_axpy(float s, float x, float p) {
  return ns_round(fmaf(s, x, ns_round(p)));
}

}  // namespace optim::kmath
