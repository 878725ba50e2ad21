#include "engine/preflight.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "core/check.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "engine/run_file.h"

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

void prepare_fresh_start(const Config& c) {
  const std::string& resume = c.checkpoint.resume;
  if (!resume.empty() && !(resume == "auto" && list_checkpoints(c.checkpoint.dir).empty())) return;
  const std::vector<fs::path> old_checkpoints = checkpoint_folders(c.checkpoint.dir);
  const fs::path metrics = fs::path(c.log.dir) / "metrics.jsonl";
  std::error_code ec;
  const bool old_metrics = fs::is_regular_file(metrics, ec) && fs::file_size(metrics, ec) > 0;
  if (old_checkpoints.empty() && !old_metrics) return;
  if (c.checkpoint.overwrite) {
    for (const auto& dir : old_checkpoints)
      fs::remove_all(dir);
    if (old_metrics) fs::remove(metrics);
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

void check_run_files(const Config& c) {
  const fs::path log = c.log.dir;
  check_run_file((log / "log.txt").string(), "the log file");
  check_run_file((log / "config.yaml").string(), "the config copy");
  check_run_file((log / "metrics.jsonl").string(), "the metrics file");
  check_run_file((log / ".engine.lock").string(), "the run lock");
  check_run_file((fs::path(c.checkpoint.dir) / ".engine.lock").string(), "the run lock");
}

}  // namespace engine
