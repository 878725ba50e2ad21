// Per-step metrics: one JSON object per line for scripts and plots, and the console lines in
// modded-nanogpt's field order so its log parsers work unchanged.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace engine {

struct StepRecord {
  int64_t step = 0;  // 1-based count of optimizer steps done
  std::optional<double> train_loss;
  std::optional<double> val_loss;
  double lr = 0;                 // schedule multiplier times the first group's base lr
  std::vector<double> group_lr;  // every optimizer group's, in the config's order
  double grad_norm = 0;          // global, before clipping
  int64_t tokens = 0;            // training tokens consumed so far (all ranks)
  double train_time_ms = 0;      // excludes validation and warm-up
  double step_ms = 0;
  double tokens_per_s = 0;
  double gflops = 0;          // achieved model FLOP rate of this step, all ranks together
  std::optional<double> mfu;  // gflops over all ranks' peak, when the peak is known
  std::vector<std::pair<std::string, int64_t>> comm_bytes;  // per collective kind, this step
  // Time this step spent blocked waiting for collectives (not the time they were in flight
  // behind computation): the exposed communication.
  std::optional<double> comm_wait_ms;
  std::vector<std::pair<std::string, double>> phase_ms;  // wall time of each step phase
  // With log.device_timing: each phase's time in the device's order of work (CUDA events on a
  // GPU), the same phases.
  std::vector<std::pair<std::string, double>> device_phase_ms;
  // CPU allocator bytes on this rank (the writer's: rank 0): the peak live during the step and
  // the live at its end.
  std::optional<int64_t> peak_mem_bytes;
  std::optional<int64_t> live_mem_bytes;
  // MoE: the step's dispatch rows (token, slot pairs) per expert, over every rank and
  // micro-step, layer by layer ([n_layer * experts], layer-major); empty without MoE. The load
  // balance, and where runs of two world sizes route differently.
  std::vector<int64_t> moe_expert_rows;
  // The build that wrote the record (engine_build_line's parts): set on the first record a
  // process writes, so a resumed run's file names every build that wrote into it.
  std::optional<std::string> engine_version;
  std::optional<std::string> engine_commit;
};

// {"step":3,"train_loss":...,...}; absent optionals are left out, non-finite numbers are null.
std::string to_json(const StepRecord& record);
// Reads back the "step" field of a line written by to_json (-1 when absent).
int64_t json_line_step(const std::string& line);

// `step:120/2000 val_loss:4.9031 train_time:81234ms step_avg:676.95ms`
std::string format_val_line(int64_t step, int64_t total, double val_loss, double train_time_ms);
// `step:121/2000 train_loss:4.8120 train_time:81911ms step_avg:676.95ms lr:6.0e-04 tok/s:12104`
std::string format_train_line(int64_t step, int64_t total, double train_loss, double train_time_ms,
                              double lr, double tokens_per_s);

// Appends records to a JSON Lines file, one write per line so a killed run keeps what it wrote.
class MetricsWriter {
 public:
  // Opens `path`; lines of an existing file with step > keep_through_step are dropped (a run
  // resumed from step s repeats the steps after s), and so is a line cut off by a crash or a
  // full disk. keep_through_step < 0 starts a new file. Throws naming the file when it cannot
  // be written.
  MetricsWriter(const std::string& path, int64_t keep_through_step);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  // Appends one line. A write that fails (a full disk, a file-size limit) cuts the file back to
  // its last whole line, warns once naming the file and the reason, and ends the writing: the
  // run goes on, the console still shows every step, and a resumed run appends again.
  void write(const StepRecord& record);
  const std::string& path() const { return path_; }
  bool stopped() const { return fd_ < 0; }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;  // bytes of whole lines written
};

}  // namespace engine
