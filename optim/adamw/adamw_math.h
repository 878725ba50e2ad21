// AdamW's element math, shared by its CPU and CUDA ops (adamw_ops.h). The stored values are
// float, the arithmetic float64: each element's trajectory is the float64 one rounded once per
// step, like the golden files. The operation order below is the order the golden replays were
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

}  // namespace optim::kmath
