#include "engine/training_health.h"

#include <cmath>
#include <cstdio>

namespace engine {

namespace {

std::string number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

}  // namespace

void TrainingHealth::check(int64_t step, double loss, double grad_norm) {
  const std::string at = "step " + std::to_string(step) + ": ";
  const std::string keep =
      ": stopping (no checkpoint is written for this step; the last good one is kept)";
  if (!std::isfinite(loss) || !std::isfinite(grad_norm))
    throw TrainingDiverged(at + "the training loss is " + number(loss) + " and the gradient norm " +
                           number(grad_norm) + keep);
  if (loss_factor_ > 0 && loss > loss_factor_ * lowest_loss_)
    throw TrainingDiverged(at + "the training loss " + number(loss) + " is above " +
                           number(loss_factor_) + "x the run's lowest, " + number(lowest_loss_) +
                           " (train.diverge_loss_factor)" + keep);
  lowest_loss_ = std::min(lowest_loss_, loss);
  zero_grad_run_ = grad_norm == 0.0 ? zero_grad_run_ + 1 : 0;
  if (zero_grad_steps_ > 0 && zero_grad_run_ >= zero_grad_steps_)
    throw TrainingDiverged(
        at + "the gradient norm has been exactly 0 for " + std::to_string(zero_grad_run_) +
        " steps (train.diverge_zero_grad_steps): the model no longer trains" + keep);
}

}  // namespace engine
