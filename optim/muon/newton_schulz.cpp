#include "optim/muon/newton_schulz.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace optim {

NewtonSchulzSchedule ns5_schedule(int steps) {
  ENGINE_CHECK(steps >= 1, "Newton-Schulz needs at least one step, got " + std::to_string(steps));
  NewtonSchulzSchedule s;
  s.coefficients.assign(steps, {3.4445f, -4.7750f, 2.0315f});
  s.norm_scale = 1.0f;
  s.norm_eps = 1e-7f;
  return s;
}

NewtonSchulzSchedule polar_express_schedule() {
  NewtonSchulzSchedule s;
  s.coefficients = {
      {8.156554524902461f, -22.48329292557795f, 15.878769915207462f},
      {4.042929935166739f, -2.808917465908714f, 0.5000178451051316f},
      {3.8916678022926607f, -2.772484153217685f, 0.5060648178503393f},
      {3.285753657755655f, -2.3681294933425376f, 0.46449024233003106f},
      {2.3465413258596377f, -1.7097828382687081f, 0.42323551169305323f},
  };
  s.norm_scale = 1.02f;
  s.norm_eps = 1e-6f;
  return s;
}

NewtonSchulzSchedule schedule_by_name(const std::string& name, int ns_steps,
                                      const std::string& context) {
  if (name == "ns5") return ns5_schedule(ns_steps);
  if (name == "polar_express") return polar_express_schedule();
  ENGINE_FAIL(context + ": unknown orthogonaliser '" + name + "' (ns5 | polar_express)");
}

double orthogonalize_flops(int64_t m, int64_t n, int iterations, int64_t batch) {
  const double g = static_cast<double>(std::min(m, n));
  const double k = static_cast<double>(std::max(m, n));
  // Gram (2 g^2 k), A^2 (2 g^3), update (2 g^2 k) per iteration.
  return static_cast<double>(batch) * iterations * (4.0 * g * g * k + 2.0 * g * g * g);
}

}  // namespace optim
