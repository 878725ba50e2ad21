// The batch stages of modded-nanogpt's record #89 (train_gpt.py at f411b3d3, TrainingSchedule
// and TRAINING_STAGES, lines 1881-2007): a run of S scheduled steps in stages, then E extension
// steps in a last stage. Each stage fixes the tokens of a step, the longest document the loader
// keeps, the short and long attention windows, the lr multiplier, and the multi-token and prefix
// loss weights, the last two ramping linearly within the stage.
//
// Bounds: stage k (< n, the scheduled ones) ends at round(S c_k), c_k the running sum of the
// durations in double as Python's accumulate adds them, rounded half to even as Python's round;
// the extension stage runs from S to S + E. At step s of stage [b, e), t = (s - b) / (e - b); a
// weight ramps as a + (b - a) t. From S + E on: the last stage at t = 1.
// LR (get_lr): m = the stage's lr multiplier; from c = int(S (1 - cooldown_frac)) on,
// lr = m (1 - t) + floor t with t = min(1, (s - c) / (S - c)). No warmup.
// Rows: every step has `rows` rows (all ranks and micro-steps); a row holds the stage's tokens /
// rows. The record: 8 GPUs x 1 row: 16384 / 32768 / 49152 tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/config.h"

namespace engine {

// A weight that ramps within its stage: start at the stage's first step, end at its end.
struct Ramp {
  double start = 0;
  double end = 0;
  double at(double t) const { return start + (end - start) * t; }
};

struct TrainingStage {
  int64_t begin_step = 0;
  int64_t end_step = 0;  // exclusive
  int64_t batch_tokens = 0;
  int64_t row_tokens = 0;  // batch_tokens / rows
  int64_t max_doc_tokens = 0;
  int64_t max_docs = 0;  // cu_seqlens entries a row (data::record_max_docs unless given)
  int64_t window_short = 0;
  int64_t window_long = 0;
  double lr_mul = 1;
  std::vector<Ramp> mtp;  // one weight per predicted offset (t+1, t+2, ...)
  Ramp prefix;
};

// What the step's forward and loss take from its stage (the trainer hands it to the model side).
struct StageSettings {
  int64_t stage = 0;
  int64_t batch_tokens = 0;
  int64_t row_tokens = 0;
  int64_t max_doc_tokens = 0;
  int64_t window_short = 0;
  int64_t window_long = 0;
  std::vector<double> mtp_weights;
  double prefix_weight = 0;
};

class StageSchedule {
 public:
  StageSchedule() = default;  // no stages: enabled() is false
  // The stages as given; `durations` has one fraction per stage but the last (the extension).
  StageSchedule(std::vector<TrainingStage> stages, const std::vector<double>& durations,
                int64_t scheduled_steps, int64_t extension_steps, double cooldown_frac,
                double lr_floor, int64_t rows, int64_t final_window = 0);

  // The schedule of the train.stages.* keys (none when train.stages.batch_tokens is ""); a
  // malformed key is refused naming it and where it was set.
  static StageSchedule of(const Config& config);
  bool enabled() const { return !stages_.empty(); }

  const std::vector<TrainingStage>& stages() const { return stages_; }
  int64_t scheduled_steps() const { return scheduled_; }
  int64_t total_steps() const { return scheduled_ + extension_; }
  int64_t rows() const { return rows_; }
  // The stage of `step` and how far through it the step is, t in [0, 1).
  const TrainingStage& stage_of(int64_t step, double* t = nullptr) const;
  int64_t stage_index(int64_t step) const;
  // The first step of each stage after the first (the record's transition steps).
  std::vector<int64_t> transition_steps() const;

  // Whether some stage weights the prefix-target loss (the model then needs the prefix table).
  bool uses_prefix() const;
  double lr_multiplier(int64_t step) const;
  // What step `step` reads; from total_steps() on (the final validation) the long window is the
  // final window when one was given (apply_final_ws_ext: ws_long = 20 blocks, the short one
  // kept).
  StageSettings settings(int64_t step) const;

 private:
  std::vector<TrainingStage> stages_;
  int64_t scheduled_ = 0;
  int64_t extension_ = 0;
  double cooldown_frac_ = 0;
  double lr_floor_ = 0;
  int64_t rows_ = 0;
  int64_t final_window_ = 0;
};

}  // namespace engine
