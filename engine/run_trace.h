// RunTrace: log.trace's timeline of chosen steps, written as Chrome trace-event JSON
// (<log.dir>/trace.json; opens in Perfetto and chrome://tracing; scripts/plot_trace.py draws it).
//
// Each rank records its spans (core/tracer.h) while a traced step runs (the step, its evaluation
// and checkpoint); after the last traced step (or at the end of a run that stops before it) the
// ranks' events are gathered to rank 0, which writes the file: one process row per rank, a
// thread row per track (the main thread, a communication thread, collectives in flight, the
// device).
//
// One clock: the steady clock of each rank, shifted by its offset from rank 0's, measured at
// start-up: after a barrier every rank reads its clock and the readings are exchanged; the offset
// is rank 0's reading minus this rank's, the median over 7 rounds. Its error is the spread of the
// ranks' exits from the barrier (microseconds on one host, where the clocks agree anyway; over a
// network about a message latency).
#pragma once

#include <cstdint>
#include <string>

#include "comm/communicator.h"
#include "core/tracer.h"

namespace engine {

class RunTrace {
 public:
  // Collective over `comm` (the clock exchange). `comm` must not be traced by this tracer.
  RunTrace(comm::Communicator& comm, int64_t first, int64_t last, std::string path);

  core::Tracer& tracer() { return tracer_; }
  // Step `step` (1-based, the step about to run) starts: tracing turns on for traced steps.
  void begin_step(int64_t step);
  // Step `step` is done with its evaluation and checkpoint: tracing turns off; after the last
  // traced step the file is written (collective).
  void end_step(int64_t step);
  // The run ends: writes what was recorded if the file is not written yet (collective).
  void finish();
  const std::string& path() const { return path_; }

 private:
  void write();

  comm::Communicator& comm_;
  int64_t first_;
  int64_t last_;
  std::string path_;
  core::Tracer tracer_;
  double shift_us_ = 0;  // to rank 0's clock, from rank 0's reading at the exchange
  bool written_ = false;
};

}  // namespace engine
