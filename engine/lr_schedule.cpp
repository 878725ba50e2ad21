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
                       double floor, DecayShape shape, bool at_step_start)
    : total_(total_steps),
      warmup_(warmup_steps),
      floor_(floor),
      shape_(shape),
      at_step_start_(at_step_start) {
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
  const int64_t done = step - decay_start_ + (at_step_start_ ? 0 : 1);
  double p = std::min(1.0, static_cast<double>(done) / span);
  if (shape_ == DecayShape::Linear) return 1.0 - p * (1.0 - floor_);
  return floor_ + (1.0 - floor_) * 0.5 * (1.0 + std::cos(std::numbers::pi * p));
}

int64_t window_at(int64_t window, int64_t step, int64_t steps) {
  constexpr int64_t kBlock = 128;
  const double blocks = std::ceil(static_cast<double>(window) * static_cast<double>(step) /
                                  (static_cast<double>(std::max<int64_t>(steps, 1)) * kBlock));
  return std::min(window, kBlock * std::max<int64_t>(1, static_cast<int64_t>(blocks)));
}

int64_t block_window_at(int64_t window, int64_t block, int64_t step, int64_t steps) {
  // train_gpt.py: next_multiple_of_n(1728 x, n=128) with x = step / steps, 1728 = 1792 - 64.
  const double x = static_cast<double>(step) / static_cast<double>(std::max<int64_t>(steps, 1));
  const double tokens = static_cast<double>(window - block / 2) * x;
  const auto blocks = static_cast<int64_t>(std::ceil(tokens / static_cast<double>(block)));
  return std::min(window, block * std::max<int64_t>(1, blocks));
}

void apply_window_schedule(model::Gpt& gpt, int64_t step, int64_t steps) {
  const model::ModelConfig& c = gpt.config();
  if (!c.window_grow) return;
  const int64_t w = c.window_block > 0 ? block_window_at(c.window, c.window_block, step, steps)
                                       : window_at(c.window, step, steps);
  gpt.set_attention_window(static_cast<int>(w));
}

}  // namespace engine
