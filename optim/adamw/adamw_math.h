// AdamW's element math, shared by its CPU and CUDA ops (adamw_ops.h). The stored values are
// float; adamw_element's arithmetic is float64: each element's trajectory is the float64 one
// rounded once per step, like the golden files (the CPU's contract). adamw_element_f32 is the
// device's form in float arithmetic. The operation order below is the order the golden replays were
// recorded with; changing it changes CPU trajectories bit for bit.
#pragma once

#include <cmath>

#include "core/kernel_math.h"

namespace optim::kmath {

// Adam moments: m <- b1 m + (1 - b1) g, v <- b2 v + (1 - b2) g^2.
template <typename T>
ENGINE_HD inline void adam_moments(T& m, T& v, T g, T beta1, T beta2) {
  m = beta1 * m + (T(1) - beta1) * g;
  v = beta2 * v + (T(1) - beta2) * g * g;
}

// The scalars of one AdamW step of one tensor, computed on the host from the step count t with
// bc1 = 1 - b1^t, bc2 = 1 - b2^t:
//   spec eps:  step_size = lr sqrt(bc2) / bc1, v_scale = 1
//   torch eps: step_size = lr / bc1,           v_scale = 1 / sqrt(bc2)
//   decoupled weight decay: decay = 1 - lr wd, cautious = 0
//   cautious weight decay:  decay = 1,         cautious = lr^2 wd
struct AdamWStep {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double step_size = 0;
  double v_scale = 1;
  double decay = 1;
  double cautious = 0;
};

// One AdamW element: the moments, then u = step_size m / (sqrt(v) v_scale + eps), plus the
// cautious decay cautious * w only where it agrees in sign with the step (u w > 0), and
// w <- w decay - u.
ENGINE_HD inline void adamw_element(float& w, float& m, float& v, float g, const AdamWStep& s) {
  const double gi = g;
  double mi = m, vi = v;
  adam_moments(mi, vi, gi, s.beta1, s.beta2);
  m = static_cast<float>(mi);
  v = static_cast<float>(vi);
  const double wi = w;
  double u = s.step_size * mi / (std::sqrt(vi) * s.v_scale + s.eps);
  u += u * wi > 0 ? s.cautious * wi : 0.0;
  w = static_cast<float>(wi * s.decay - u);
}

// The device's form of the step's scalars, in float: the betas' complements and the decoupled
// decay's rate 1 - decay are taken in float64 first (1 - 0.999 or 1 - 1e-6 rounded to float
// keeps their digits; the float of 0.999 or of 1 - 1e-6 would not).
struct AdamWStepF32 {
  float one_minus_beta1, one_minus_beta2, eps, step_size, v_scale, decay_rate, cautious;
};

inline AdamWStepF32 adamw_step_f32(const AdamWStep& s) {
  return {static_cast<float>(1 - s.beta1), static_cast<float>(1 - s.beta2),
          static_cast<float>(s.eps),       static_cast<float>(s.step_size),
          static_cast<float>(s.v_scale),   static_cast<float>(1 - s.decay),
          static_cast<float>(s.cautious)};
}

// adamw_element in float arithmetic (a GPU's float64 rate is a fraction of its float rate).
// The forms differ where float would drift:
// - the moments as m + (1 - b1)(g - m): the float of 0.999 plus 1 - 0.999 exceeds 1 by 1e-8, a
//   bias that b2 v + (1 - b2) g^2 compounds over the steps (2e-6 in 200, measured);
// - the weight as w - ((1 - decay) w + u): one rounding at w's scale, where w - (1 - decay) w - u
//   takes two, and their errors walk (7e-6 in 200 steps, measured).
// The stored values then stay within a few float ulps of the float64 form's
// (UpdateOps.AdamWF32ElementFollowsTheF64One).
ENGINE_HD inline void adamw_element_f32(float& w, float& m, float& v, float g,
                                        const AdamWStepF32& s) {
  m = m + s.one_minus_beta1 * (g - m);
  v = v + s.one_minus_beta2 * (g * g - v);
  float u = s.step_size * m / (std::sqrt(v) * s.v_scale + s.eps);
  u += u * w > 0 ? s.cautious * w : 0.0f;
  w = w - (s.decay_rate * w + u);
}

}  // namespace optim::kmath
