// The SOAP family's element math, shared by its CPU and CUDA ops (soap_ops.h): float arithmetic
// in the operation order of the SOAP reference (and of the host loops the golden files were
// replayed with before these ops existed), so on the CPU the results are those bits.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/kernel_math.h"

namespace optim::kmath {

// KL-Shampoo's weight of an eigen direction of a factor of size n: 1 / n / max(lam, eps) in
// float64, rounded to float (C = Q diag(weights) Q^T). The max is std::max's (a NaN stays).
ENGINE_HD inline float kl_inverse_weight(float lam, double eps, int64_t n) {
  const double l = static_cast<double>(lam);
  return static_cast<float>(1.0 / static_cast<double>(n) / (l < eps ? eps : l));
}

// Its square root, in float64 and rounded once: with B = Q diag(root weights), C = B B^T, so
// KL-Shampoo's statistic G C G^T is (G B)(G B)^T and C itself is never formed.
ENGINE_HD inline float kl_inverse_root_weight(float lam, double eps, int64_t n) {
  const double l = static_cast<double>(lam);
  return static_cast<float>(std::sqrt(1.0 / static_cast<double>(n) / (l < eps ? eps : l)));
}

// The scalars of one Adam step in the eigenbasis (spec section 1.2, step k = t + 1):
//   raw (adam_eps: raw):  m <- b1 m + (1 - b1) g, v <- b2 v + (1 - b2) g^2, d = m / (sqrt(v) + eps)
//   corrected:            m <- lerp(m, g, w1), v <- lerp(v, g^2, w2),
//                         d = n / (sqrt(v / c2) + eps), n = m / c1, or with nesterov
//                         n = b1 m / cn + (1 - b1) g / c1
// with w1 = float(1 - beta1), w2 = float(1 - beta2) (formed in float64), c1 = 1 - b1^k,
// c2 = 1 - b2^k, cn = 1 - b1^(k+1) (1 without bias correction).
struct SoapAdamStep {
  bool raw = false;
  bool nesterov = false;
  float beta1 = 0.9f, beta2 = 0.95f;
  float w1 = 0.1f, w2 = 0.05f;
  float eps = 1e-8f;
  float c1 = 1, c2 = 1, cn = 1;
};

ENGINE_HD inline float soap_adam_raw(float& m, float& v, float g, const SoapAdamStep& s) {
  m = s.beta1 * m + (1.0f - s.beta1) * g;
  v = s.beta2 * v + (1.0f - s.beta2) * g * g;
  return m / (std::sqrt(v) + s.eps);
}

// g2 is g * g rounded to float, formed apart from the lerp (as the reference stores it).
ENGINE_HD inline float soap_adam_corrected(float& m, float& v, float g, float g2,
                                           const SoapAdamStep& s) {
  m = core::kmath::lerp(m, g, s.w1);
  v = core::kmath::lerp(v, g2, s.w2);
  const float num = s.nesterov ? s.beta1 * m / s.cn + (1.0f - s.beta1) * g / s.c1 : m / s.c1;
  return num / (std::sqrt(v / s.c2) + s.eps);
}

// The max_update_rms clip factor min(1, max_rms / (rms + 1e-7)) of an update of n elements with
// float64 sum of squares ss, rounded to float.
ENGINE_HD inline float soap_rms_clip_scale(double ss, int64_t n, double max_rms) {
  const double rms = std::sqrt(ss / static_cast<double>(n));
  const double s = max_rms / (rms + 1e-7);
  return static_cast<float>(s < 1.0 ? s : 1.0);
}

}  // namespace optim::kmath
