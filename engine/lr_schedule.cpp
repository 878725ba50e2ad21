#include "engine/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/check.h"

namespace engine {

DecayShape parse_decay_shape(const std::string& name) {
  if (name == "constant") return DecayShape::Constant;
  if (name == "linear") return DecayShape::Linear;
  if (name == "cosine") return DecayShape::Cosine;
  ENGINE_FAIL("unknown lr schedule '" + name + "' (expected constant, linear or cosine)");
}

LrSchedule::LrSchedule(int64_t total_steps, int64_t warmup_steps, double cooldown_frac,
                       double floor, DecayShape shape)
    : total_(total_steps), warmup_(warmup_steps), floor_(floor), shape_(shape) {
  ENGINE_CHECK(total_steps >= 1, "lr schedule: total steps must be >= 1");
  ENGINE_CHECK(warmup_steps >= 0, "lr schedule: warmup steps must be >= 0");
  ENGINE_CHECK(cooldown_frac >= 0 && cooldown_frac <= 1, "lr schedule: cooldown_frac not in [0,1]");
  int64_t cooldown = static_cast<int64_t>(std::llround(cooldown_frac * total_steps));
  decay_start_ = std::max(warmup_, total_ - cooldown);
  if (shape_ == DecayShape::Constant) decay_start_ = total_;
}

double LrSchedule::multiplier(int64_t step) const {
  if (step < warmup_) return static_cast<double>(step + 1) / static_cast<double>(warmup_);
  if (step < decay_start_) return 1.0;
  double span = static_cast<double>(total_ - decay_start_);
  double p = std::min(1.0, static_cast<double>(step - decay_start_ + 1) / span);
  if (shape_ == DecayShape::Linear) return 1.0 - p * (1.0 - floor_);
  return floor_ + (1.0 - floor_) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
}

int64_t window_at(int64_t window, int64_t step, int64_t steps) {
  constexpr int64_t kBlock = 128;
  const double blocks = std::ceil(static_cast<double>(window) * static_cast<double>(step) /
                                  (static_cast<double>(std::max<int64_t>(steps, 1)) * kBlock));
  return std::min(window, kBlock * std::max<int64_t>(1, static_cast<int64_t>(blocks)));
}

void apply_window_schedule(model::Gpt& gpt, int64_t step, int64_t steps) {
  if (gpt.config().window_grow)
    gpt.set_attention_window(static_cast<int>(window_at(gpt.config().window, step, steps)));
}

}  // namespace engine
