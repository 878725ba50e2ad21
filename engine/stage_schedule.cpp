#include "engine/stage_schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "core/check.h"
#include "core/kernel_math.h"
#include "data/document_loader.h"

namespace engine {

namespace {

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// "a; b; c" -> {"a", "b", "c"} (an empty text: no items).
std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  if (trim(text).empty()) return out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, sep))
    out.push_back(trim(item));
  return out;
}

// Reads the train.stages.* keys, each refusal naming the key and where it was set.
class StageKeys {
 public:
  explicit StageKeys(const Config& c) : c_(c) {}

  [[noreturn]] void fail(const std::string& key, const std::string& message) const {
    ENGINE_FAIL("config error: " + config_origin(c_, key) + ": key '" + key + "': " + message);
  }
  // The key's ';'-separated items, `count` of them.
  std::vector<std::string> items(const std::string& key, const std::string& text,
                                 size_t count) const {
    std::vector<std::string> out = split(text, ';');
    if (out.size() != count)
      fail(key, "has " + std::to_string(out.size()) + " stages ('" + text + "'), expected " +
                    std::to_string(count) + " (one per entry of train.stages.batch_tokens" +
                    (key == "train.stages.durations" ? ", less the extension stage)" : ")"));
    return out;
  }
  double number(const std::string& key, const std::string& text) const {
    // "a/b": the fraction as Python's a / b.
    if (const auto slash = text.find('/'); slash != std::string::npos)
      return number(key, text.substr(0, slash)) / number(key, text.substr(slash + 1));
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v))
      fail(key, "'" + text + "' is not a number");
    return v;
  }
  int64_t integer(const std::string& key, const std::string& text) const {
    const double v = number(key, text);
    if (v != std::floor(v) || v < 1 || v > 9.0e15)
      fail(key, "'" + text + "' is not a positive integer");
    return static_cast<int64_t>(v);
  }
  // "a" or "a>b": a weight constant in its stage, or ramping from a to b.
  Ramp ramp(const std::string& key, const std::string& text) const {
    if (const auto arrow = text.find('>'); arrow != std::string::npos)
      return {number(key, trim(text.substr(0, arrow))), number(key, trim(text.substr(arrow + 1)))};
    const double v = number(key, text);
    return {v, v};
  }

 private:
  const Config& c_;
};

}  // namespace

StageSchedule::StageSchedule(std::vector<TrainingStage> stages,
                             const std::vector<double>& durations, int64_t scheduled_steps,
                             int64_t extension_steps, double cooldown_frac, double lr_floor,
                             int64_t rows, int64_t final_window)
    : stages_(std::move(stages)),
      scheduled_(scheduled_steps),
      extension_(extension_steps),
      cooldown_frac_(cooldown_frac),
      lr_floor_(lr_floor),
      rows_(rows),
      final_window_(final_window) {
  ENGINE_CHECK(!stages_.empty() && durations.size() + 1 == stages_.size(),
               "stage schedule: one duration per stage but the extension stage");
  ENGINE_CHECK(scheduled_ >= 1 && extension_ >= 0, "stage schedule: steps must be positive");
  // ends = [0, round(c S) for c in accumulate(durations)] + [S + E]; the last scheduled end must
  // be S (the record asserts it).
  double sum = 0;
  int64_t begin = 0;
  for (size_t k = 0; k < durations.size(); ++k) {
    sum += durations[k];
    const auto end = static_cast<int64_t>(std::nearbyint(sum * static_cast<double>(scheduled_)));
    ENGINE_CHECK(end >= begin,
                 "stage schedule: stage " + std::to_string(k) + " ends before it begins");
    stages_[k].begin_step = begin;
    stages_[k].end_step = end;
    begin = end;
  }
  ENGINE_CHECK(begin == scheduled_, "stage schedule: the durations end at step " +
                                        std::to_string(begin) +
                                        ", not at "
                                        "the scheduled steps' end " +
                                        std::to_string(scheduled_) + " (they must sum to 1)");
  stages_.back().begin_step = scheduled_;
  stages_.back().end_step = scheduled_ + extension_;
}

StageSchedule StageSchedule::of(const Config& c) {
  const auto& st = c.train;
  if (trim(st.stages_batch_tokens).empty()) return StageSchedule();
  const StageKeys keys(c);
  const std::vector<std::string> batch = split(st.stages_batch_tokens, ';');
  const size_t n = batch.size();
  if (n < 2)
    keys.fail("train.stages.batch_tokens",
              "needs at least two stages: the scheduled ones, then the extension stage");
  if (st.stages_rows < 1) keys.fail("train.stages.rows", "must be >= 1");
  if (st.stages_extension_steps < 0 || st.stages_extension_steps >= st.steps)
    keys.fail("train.stages.extension_steps",
              "must be in [0, train.steps = " + std::to_string(st.steps) + ")");
  if (st.stages_final_window < 0) keys.fail("train.stages.final_window", "must be >= 0");
  if (st.lr_warmup_steps != 0)
    keys.fail("train.lr_warmup_steps", "must be 0 with train.stages (the record has no warmup)");
  const auto docs = keys.items("train.stages.max_doc_tokens", st.stages_max_doc_tokens, n);
  const auto windows = keys.items("train.stages.windows", st.stages_windows, n);
  const auto lr = keys.items("train.stages.lr_mul", st.stages_lr_mul, n);
  const auto mtp = keys.items("train.stages.mtp", st.stages_mtp, n);
  const auto prefix = keys.items("train.stages.prefix", st.stages_prefix, n);
  const auto caps = trim(st.stages_max_docs).empty()
                        ? std::vector<std::string>()
                        : keys.items("train.stages.max_docs", st.stages_max_docs, n);
  std::vector<double> durations;
  for (const std::string& d : keys.items("train.stages.durations", st.stages_durations, n - 1)) {
    durations.push_back(keys.number("train.stages.durations", d));
    if (durations.back() <= 0) keys.fail("train.stages.durations", "'" + d + "' must be positive");
  }
  std::vector<TrainingStage> stages(n);
  for (size_t k = 0; k < n; ++k) {
    TrainingStage& s = stages[k];
    s.batch_tokens = keys.integer("train.stages.batch_tokens", batch[k]);
    if (s.batch_tokens % st.stages_rows != 0)
      keys.fail("train.stages.batch_tokens", batch[k] +
                                                 " tokens do not divide into train.stages.rows = " +
                                                 std::to_string(st.stages_rows) + " rows");
    s.row_tokens = s.batch_tokens / st.stages_rows;
    if (s.row_tokens > c.model.seq_len)
      keys.fail("train.stages.batch_tokens",
                "stage " + std::to_string(k) + "'s rows of " + std::to_string(s.row_tokens) +
                    " tokens are longer than model.seq_len = " + std::to_string(c.model.seq_len));
    s.max_doc_tokens = keys.integer("train.stages.max_doc_tokens", docs[k]);
    s.max_docs = caps.empty() ? data::record_max_docs(s.row_tokens)
                              : keys.integer("train.stages.max_docs", caps[k]);
    if (s.max_docs < 2) keys.fail("train.stages.max_docs", "each must be >= 2");
    const std::vector<std::string> w = split(windows[k], ' ');
    if (w.size() != 2)
      keys.fail("train.stages.windows", "stage '" + windows[k] + "' is not 'SHORT LONG'");
    s.window_short = keys.integer("train.stages.windows", w[0]);
    s.window_long = keys.integer("train.stages.windows", w[1]);
    if (s.window_short < 1 || s.window_short > s.window_long)
      keys.fail("train.stages.windows",
                "stage '" + windows[k] + "': the short window must be in [1, the long one]");
    s.lr_mul = keys.number("train.stages.lr_mul", lr[k]);
    for (const std::string& r : split(mtp[k], ' '))
      if (!r.empty()) s.mtp.push_back(keys.ramp("train.stages.mtp", r));
    if (s.mtp.empty()) keys.fail("train.stages.mtp", "stage " + std::to_string(k) + " is empty");
    // The loss takes up to kMaxOffsets targets (t+1 ..), each weight >= 0.
    const int most = core::kmath::LossTerms::kMaxOffsets;
    if (static_cast<int>(s.mtp.size()) > most) {
      keys.fail("train.stages.mtp", "stage '" + mtp[k] + "' has " + std::to_string(s.mtp.size()) +
                                        " weights, at most " + std::to_string(most));
    }
    s.prefix = keys.ramp("train.stages.prefix", prefix[k]);
    for (const Ramp& r : s.mtp) {
      if (r.start < 0 || r.end < 0)
        keys.fail("train.stages.mtp", "stage '" + mtp[k] + "' has a negative weight");
    }
    if (s.prefix.start < 0 || s.prefix.end < 0)
      keys.fail("train.stages.prefix", "stage '" + prefix[k] + "' has a negative weight");
  }
  try {
    return StageSchedule(std::move(stages), durations, st.steps - st.stages_extension_steps,
                         st.stages_extension_steps, st.lr_cooldown_frac, st.lr_floor,
                         st.stages_rows, st.stages_final_window);
  } catch (const core::Error& e) {
    keys.fail("train.stages.durations", e.what());
  }
}

int64_t StageSchedule::stage_index(int64_t step) const {
  ENGINE_CHECK(enabled(), "stage schedule: no stages");
  for (size_t k = 0; k < stages_.size(); ++k)
    if (step < stages_[k].end_step) return static_cast<int64_t>(k);
  return static_cast<int64_t>(stages_.size()) - 1;
}

const TrainingStage& StageSchedule::stage_of(int64_t step, double* t) const {
  const TrainingStage& s = stages_[static_cast<size_t>(stage_index(step))];
  if (t) {
    // lookup(): (step - start) / (end - start) inside a stage, 1.0 from the run's end on.
    *t = step < s.end_step ? static_cast<double>(step - s.begin_step) /
                                 static_cast<double>(s.end_step - s.begin_step)
                           : 1.0;
  }
  return s;
}

std::vector<int64_t> StageSchedule::transition_steps() const {
  std::vector<int64_t> out;
  for (size_t k = 1; k < stages_.size(); ++k)
    out.push_back(stages_[k].begin_step);
  return out;
}

bool StageSchedule::uses_prefix() const {
  for (const TrainingStage& s : stages_)
    if (s.prefix.start != 0 || s.prefix.end != 0) return true;
  return false;
}

double StageSchedule::lr_multiplier(int64_t step) const {
  double lr = stage_of(step).lr_mul;
  const auto cooldown_start =
      static_cast<int64_t>(static_cast<double>(scheduled_) * (1.0 - cooldown_frac_));
  if (step >= cooldown_start) {
    const double t = std::min(1.0, static_cast<double>(step - cooldown_start) /
                                       static_cast<double>(scheduled_ - cooldown_start));
    lr = lr * (1 - t) + lr_floor_ * t;
  }
  return lr;
}

StageSettings StageSchedule::settings(int64_t step) const {
  double t = 0;
  const TrainingStage& s = stage_of(step, &t);
  StageSettings out;
  out.stage = stage_index(step);
  out.batch_tokens = s.batch_tokens;
  out.row_tokens = s.row_tokens;
  out.max_doc_tokens = s.max_doc_tokens;
  out.window_short = s.window_short;
  out.window_long = s.window_long;
  for (const Ramp& r : s.mtp)
    out.mtp_weights.push_back(r.at(t));
  out.prefix_weight = s.prefix.at(t);
  if (step >= total_steps() && final_window_ > 0) out.window_long = final_window_;
  return out;
}

}  // namespace engine
