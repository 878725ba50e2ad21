#include "engine/preflight.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <utility>

#include "core/check.h"
#include "core/output_file.h"
#include "engine/checkpoint/checkpoint_files.h"

namespace engine {

namespace fs = std::filesystem;

namespace {

std::string source_of(const Config& c) {
  return c.source.empty() ? "config" : c.source;
}

std::string gigabytes(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g GB", bytes / 1e9);
  return buf;
}

// Folders named like checkpoints (complete, staging or replaced ones) directly under root.
std::vector<fs::path> checkpoint_folders(const std::string& root) {
  std::vector<fs::path> found;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return found;
  for (const auto& entry : fs::directory_iterator(root, ec))
    if (entry.is_directory() && entry.path().filename().string().rfind("step_", 0) == 0)
      found.push_back(entry.path());
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace

double estimated_parameters(const Config& c) {
  const double d = static_cast<double>(c.model.d_model);
  const double experts = std::max<double>(1.0, static_cast<double>(c.model.moe_experts));
  // Attention 4 D^2, MLP 8 D^2 per expert, per block; token embedding and head V x D; positions.
  return static_cast<double>(c.model.n_layer) * d * d * (4.0 + 8.0 * experts) +
         2.0 * static_cast<double>(c.model.vocab_size) * d +
         static_cast<double>(c.model.seq_len) * d;
}

void check_model_fits_memory(const Config& c, double memory_bytes) {
  if (memory_bytes <= 0)
    memory_bytes =
        static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  const double params = estimated_parameters(c);
  const double bytes = 8.0 * params;  // float32 values and gradients
  if (bytes <= memory_bytes) return;
  char count[32];
  std::snprintf(count, sizeof(count), "%.3g", params);
  throw core::Error(
      "config error: " + source_of(c) + ": the model of model.d_model = " +
      std::to_string(c.model.d_model) + ", model.n_layer = " + std::to_string(c.model.n_layer) +
      ", model.vocab_size = " + std::to_string(c.model.vocab_size) +
      (c.model.moe_experts > 0 ? ", model.moe.experts = " + std::to_string(c.model.moe_experts)
                               : std::string()) +
      " has about " + count +
      " parameters: their float32 values and gradients "
      "alone need " +
      gigabytes(bytes) + ", more than this machine's " + gigabytes(memory_bytes) + " of memory");
}

namespace {

// The config with what a restart may change (checkpoint.resume, checkpoint.overwrite) made equal,
// as YAML.
std::string restart_invariant_yaml(Config c) {
  c.checkpoint.resume = "auto";
  c.checkpoint.overwrite = false;
  return config_to_yaml(c);
}

// The step of the last line of a metrics file ({"step":N,...}), or -1 when it has none.
int64_t last_logged_step(const fs::path& metrics) {
  std::ifstream in(metrics, std::ios::binary);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  const std::string key = "\"step\":";
  const size_t at = last.find(key);
  if (at == std::string::npos) return -1;
  return std::strtoll(last.c_str() + at + key.size(), nullptr, 10);
}

// Whether the folders hold only what a start of this very config left before its first
// checkpoint was complete: staging (.tmp) or removed (.old) folders, a metrics file that stops
// before train.steps (a run that finished without saving is no unfinished attempt), and a
// log.dir/config.yaml (written at its start) equal to this config but for checkpoint.resume and
// .overwrite.
bool only_this_runs_first_attempt(const Config& c, const std::vector<fs::path>& folders) {
  for (const fs::path& dir : folders) {
    const std::string name = dir.filename().string();
    if (!name.ends_with(".tmp") && !name.ends_with(".old")) return false;
  }
  if (last_logged_step(fs::path(c.log.dir) / "metrics.jsonl") >= c.train.steps) return false;
  const fs::path saved = fs::path(c.log.dir) / "config.yaml";
  std::error_code ec;
  if (!fs::is_regular_file(fs::symlink_status(saved, ec))) return false;
  std::ifstream in(saved, std::ios::binary);
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  try {
    return restart_invariant_yaml(parse_config(text, saved.string())) == restart_invariant_yaml(c);
  } catch (const core::Error&) {
    return false;
  }
}

}  // namespace

void prepare_run_folders(const Config& c) {
  for (const auto& [key, dir] : {std::pair<std::string, std::string>{"log.dir", c.log.dir},
                                 {"checkpoint.dir", c.checkpoint.dir}}) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    std::string reason;
    if (ec)
      reason = "cannot be created: " + ec.message();
    else if (!fs::is_directory(dir, ec))
      reason = "is not a folder";
    else if (::access(dir.c_str(), W_OK | X_OK) != 0)
      reason = std::string("is not writable: ") + std::strerror(errno);
    if (reason.empty()) continue;
    throw core::Error("config error: " + config_origin(c, key) + ": key '" + key + "': folder '" +
                      dir + "' " + reason + " (a run writes its " +
                      (key == "log.dir" ? "logs and metrics" : "checkpoints") + " there)");
  }
}

void prepare_fresh_start(const Config& c) {
  const std::string& resume = c.checkpoint.resume;
  if (!resume.empty() && !(resume == "auto" && list_checkpoints(c.checkpoint.dir).empty())) return;
  const std::vector<fs::path> old_checkpoints = checkpoint_folders(c.checkpoint.dir);
  const fs::path metrics = fs::path(c.log.dir) / "metrics.jsonl";
  std::error_code ec;
  const bool old_metrics = fs::is_regular_file(metrics, ec) && fs::file_size(metrics, ec) > 0;
  if (old_checkpoints.empty() && !old_metrics) return;
  // A requeued job (the same command again) whose first attempt was stopped before its first
  // checkpoint was complete: nothing to resume, and nothing of another run to keep.
  if (resume == "auto" && only_this_runs_first_attempt(c, old_checkpoints)) {
    for (const auto& dir : old_checkpoints)
      fs::remove_all(dir);
    if (old_metrics) fs::remove(metrics);
    spdlog::warn(
        "checkpoint.resume=auto: no complete checkpoint in {}; starting afresh, since what is "
        "there ({}{}) is this config's own first attempt, stopped before its first checkpoint "
        "was complete (log.dir/config.yaml is this config)",
        c.checkpoint.dir,
        old_checkpoints.empty() ? std::string()
                                : std::to_string(old_checkpoints.size()) + " unfinished save(s)",
        old_metrics ? std::string(old_checkpoints.empty() ? "" : " and ") + metrics.string()
                    : std::string());
    return;
  }
  if (c.checkpoint.overwrite) {
    for (const auto& dir : old_checkpoints)
      fs::remove_all(dir);
    if (old_metrics) fs::remove(metrics);
    // TensorBoard reads every event file of the folder: the earlier run's would mix with this.
    for (const auto& entry : fs::directory_iterator(c.log.dir, ec))
      if (entry.path().filename().string().starts_with("events.out.tfevents."))
        fs::remove(entry.path(), ec);
    return;
  }
  std::string held;
  if (!old_checkpoints.empty())
    held = c.checkpoint.dir + " holds " + std::to_string(old_checkpoints.size()) +
           " checkpoint folder(s) of an earlier run (" +
           old_checkpoints.front().filename().string() +
           (old_checkpoints.size() > 1 ? " ... " + old_checkpoints.back().filename().string()
                                       : std::string()) +
           ")";
  if (old_metrics)
    held += (held.empty() ? "" : " and ") + metrics.string() + " holds an earlier run's metrics";
  // "Resume it" is a choice only when a complete checkpoint is there: a run stopped before its
  // first one was saved left nothing to resume, and a restart with checkpoint.resume=auto was
  // told to give checkpoint.resume=auto.
  const bool resumable = !list_checkpoints(c.checkpoint.dir).empty();
  throw core::Error(
      "refusing a fresh start: " + held +
      (resumable ? ""
                 : ", and no complete checkpoint to resume (the earlier run saved none, or "
                   "was stopped before its first one was complete)") +
      "; a new run there would mix with it. Choose one: " +
      (resumable ? "resume it (--set checkpoint.resume=auto), " : "") +
      "write elsewhere (--set log.dir=... --set checkpoint.dir=...), or replace it (--set "
      "checkpoint.overwrite=true deletes those checkpoints and the metrics file)");
}

void prepare_resume_from_older(const Config& c, const std::string& resume, int64_t from) {
  std::vector<std::string> newer;
  for (const std::string& dir : list_checkpoints(c.checkpoint.dir))
    if (std::stoll(fs::path(dir).filename().string().substr(5)) > from) newer.push_back(dir);
  if (newer.empty()) return;
  const std::string names =
      std::to_string(newer.size()) + " newer checkpoint(s) (" +
      fs::path(newer.front()).filename().string() +
      (newer.size() > 1 ? " ... " + fs::path(newer.back()).filename().string() : std::string()) +
      ")";
  if (c.checkpoint.overwrite) {
    for (const std::string& dir : newer)
      fs::remove_all(dir);
    spdlog::warn("resuming from {} at step {}: deleted the {} in {} (checkpoint.overwrite=true)",
                 resume, from, names, c.checkpoint.dir);
    return;
  }
  throw core::Error(
      "refusing to resume from " + resume + " (step " + std::to_string(from) +
      "): " + c.checkpoint.dir + " holds " + names +
      ", which this run's saves would replace and its rotation would keep over its own. Choose "
      "one: resume the newest (--set checkpoint.resume=auto), write elsewhere (--set "
      "checkpoint.dir=...), or drop them (--set checkpoint.overwrite=true deletes the newer "
      "checkpoints)");
}

void check_run_files(const Config& c) {
  const fs::path log = c.log.dir;
  // Written in place (a character device such as /dev/null takes the writes) ...
  constexpr core::DeviceTarget in_place = core::DeviceTarget::Allowed;
  core::check_output_file((log / "log.txt").string(), "the log file", in_place);
  core::check_output_file((log / "metrics.jsonl").string(), "the metrics file", in_place);
  core::check_output_file((log / ".engine.lock").string(), "the run lock", in_place);
  core::check_output_file((fs::path(c.checkpoint.dir) / ".engine.lock").string(), "the run lock",
                          in_place);
  // ... or whole and renamed into place: only a regular file is replaced.
  core::check_output_file((log / "config.yaml").string(), "the config copy");
  if (!c.log.trace.empty())
    core::check_output_file((log / "trace.json").string(), "the trace file");
}

}  // namespace engine
