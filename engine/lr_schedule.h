// Schedules over a run's steps. The learning-rate multiplier per step: linear warmup, a stable
// phase at 1, then a decay to a floor over the last `cooldown_frac` of the run
// (warmup-stable-decay); each optimizer group multiplies its own base lr by this. And the
// record's attention-window warmup.
#pragma once

#include <cstdint>
#include <string>

#include "model/gpt.h"

namespace engine {

enum class DecayShape { Constant, Linear, Cosine };

DecayShape parse_decay_shape(const std::string& name);  // "constant" | "linear" | "cosine"

class LrSchedule {
 public:
  LrSchedule(int64_t total_steps, int64_t warmup_steps, double cooldown_frac, double floor,
             DecayShape shape, bool at_step_start = false);
  // Multiplier for optimizer step `step` (0-based: the update that ends step step+1).
  // Warmup: (step+1)/warmup. Decay over steps [decay_start, total): progress p in (0, 1] reaches
  // 1 at the last step; linear 1 - p (1 - floor), cosine floor + (1 - floor)(1 + cos(pi p))/2.
  // at_step_start (the record's get_lr(step), x = step / steps): p counts the decay steps before
  // this one, in [0, 1): 1 at decay_start, floor + (1 - floor) / span at the last step.
  double multiplier(int64_t step) const;

 private:
  int64_t total_;
  int64_t warmup_;
  int64_t decay_start_;
  double floor_;
  DecayShape shape_;
  bool at_step_start_;
};

// The record's sliding-window warmup (docs/specs/modded_nanogpt.md c.1): the long window of
// step `step` of `steps` grows linearly to `window` in blocks of 128 tokens,
// min(window, 128 max(1, ceil(window step / (steps 128)))): 128 at the start, `window` at the end.
int64_t window_at(int64_t window, int64_t step, int64_t steps);

// The record's rule with model.window_block = `block` (train_gpt.py get_window_size_blocks):
// block max(1, ceil((window - block / 2) x / block)) with x = step / steps, at most `window`:
// for window 1792 in blocks of 128, the next multiple of 128 of 1728 x (one block at the start,
// 14 from x > 0.963 on).
int64_t block_window_at(int64_t window, int64_t block, int64_t step, int64_t steps);

// With model.window_grow, sets gpt's long window to window_at(step) of `steps`: training step
// `step` and the validation after `step` steps see the same window, in a run and in
// `engine eval` of its checkpoints. Nothing otherwise.
void apply_window_schedule(model::Gpt& gpt, int64_t step, int64_t steps);

}  // namespace engine
