#include "engine/run_trace.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <string_view>
#include <vector>

#include "core/check.h"
#include "core/output_file.h"

namespace engine {

namespace {

constexpr int kClockRounds = 7;
constexpr std::string_view kSpanPhase = "\"ph\":\"X\"";  // a span's event (core/tracer.h)

}  // namespace

RunTrace::RunTrace(comm::Communicator& comm, int64_t first, int64_t last, std::string path)
    : comm_(comm), first_(first), last_(last), path_(std::move(path)) {
  const int W = comm_.size();
  std::vector<double> offsets;
  double origin = 0;
  for (int round = 0; round < kClockRounds; ++round) {
    std::vector<double> now(W, 0.0);
    comm_.barrier();
    now[comm_.rank()] = core::Tracer::now_us();
    comm_.all_reduce(now.data(), W, comm::ReduceOp::Sum);
    offsets.push_back(now[0] - now[comm_.rank()]);
    origin = now[0];
  }
  std::nth_element(offsets.begin(), offsets.begin() + kClockRounds / 2, offsets.end());
  shift_us_ = offsets[kClockRounds / 2] - origin;
}

void RunTrace::begin_step(int64_t step) {
  tracer_.set_active(step >= first_ && step <= last_ && !written_);
}

void RunTrace::end_step(int64_t step) {
  tracer_.set_active(false);
  if (step >= last_) finish();
}

void RunTrace::finish() {
  tracer_.set_active(false);
  if (written_) return;
  written_ = true;
  write();
}

void RunTrace::write() {
  const int rank = comm_.rank();
  const std::vector<std::string> parts = comm::all_gather_text(
      comm_, core::chrome_trace_events(tracer_, rank, "rank " + std::to_string(rank), shift_us_));
  tracer_.clear_spans();
  if (rank != 0) return;
  const std::filesystem::path file(path_);
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
  std::string text = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  bool first = true;
  size_t spans = 0;
  for (const std::string& part : parts) {
    if (part.empty()) continue;
    if (!first) text += ",\n";
    text += part;
    first = false;
    for (size_t at = part.find(kSpanPhase); at != std::string::npos;
         at = part.find(kSpanPhase, at + 1))
      ++spans;
  }
  text += "\n]}\n";
  try {
    // Not through a link planted in the log folder, and whole or not at all: a full disk left
    // a 0-byte trace.json when it was written in place.
    core::write_output_file(path_, text, "the trace file");
  } catch (const core::Error& e) {  // the run goes on: a trace is not worth a training run
    spdlog::warn("log.trace: could not write {}: {}", path_, e.what());
    return;
  }
  spdlog::info("trace of steps {}-{} written to {} ({} spans of {} ranks)", first_, last_, path_,
               spans, parts.size());
}

}  // namespace engine
