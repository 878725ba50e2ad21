// What a person watching a run reads beyond modded-nanogpt's fields: the estimated time left,
// the model FLOP utilisation, a statistics line (gradient norm, memory), and the text log file
// <log.dir>/log.txt that receives every console line of the run.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace spdlog::sinks {
class sink;
}

namespace engine {

// "45s", "3m05s", "1h02m".
std::string format_duration(double seconds);

// Peak dense GFLOP/s of one GPU for the engine's math in train.precision: "fp32" on the CUDA
// cores, "tf32" and "bf16" on the tensor cores; looked up by the device name inside a backend
// name such as "cuda:0 (NVIDIA H100 80GB HBM3)"; nullopt for an unknown device or precision, or
// the CPU. An MFU is against the peak of the precision the run computes in.
std::optional<double> gpu_peak_gflops(const std::string& backend_name,
                                      const std::string& precision = "fp32");

// The fields the training line gains after modded-nanogpt's: `eta:3m05s mfu:41.2%` (`eta:3m05s`
// without a peak: unknown_peak_note says once at the start how to give one).
std::string format_progress_fields(double eta_seconds, std::optional<double> mfu);
// The line printed once at the start of a run on a device whose peak is not known, instead of an
// unknown mfu on every line: how to set log.peak_gflops.
std::string unknown_peak_note(const std::string& backend_name);

// `step:120/2000 grad_norm:0.8123 peak_mem:512.3MiB live_mem:301.0MiB`
std::string format_stats_line(int64_t step, int64_t total, double grad_norm,
                              std::optional<int64_t> peak_mem_bytes,
                              std::optional<int64_t> live_mem_bytes);

// Tees spdlog's default logger into a text file while it lives: appended to (a resumed run) or
// started anew. A write that fails (a full disk) cuts the file back to its last whole line,
// warns once on stderr naming the file, and ends the file's lines; the console goes on.
class LogFile {
 public:
  LogFile(const std::string& path, bool append);
  ~LogFile();
  LogFile(const LogFile&) = delete;
  LogFile& operator=(const LogFile&) = delete;

 private:
  std::shared_ptr<spdlog::sinks::sink> sink_;
};

}  // namespace engine
