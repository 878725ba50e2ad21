#include "engine/console_log.h"

#include <fcntl.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "core/output_file.h"

namespace engine {

namespace {

std::string printf_string(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, value);
  return buf;
}

}  // namespace

std::string format_duration(double seconds) {
  const auto s = static_cast<int64_t>(std::llround(std::max(seconds, 0.0)));
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof(buf), "%llds", static_cast<long long>(s));
  else if (s < 3600)
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  else
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60));
  return buf;
}

std::optional<double> gpu_peak_gflops(const std::string& backend_name,
                                      const std::string& precision) {
  // Dense peaks (no sparsity) from the vendors' data sheets, GFLOP/s: f32 on the CUDA cores, TF32
  // and bf16 (f32 accumulation) on the tensor cores; 0 where this table does not know it. More
  // specific names first.
  struct Peaks {
    const char* name;
    double fp32, tf32, bf16;
  };
  static constexpr std::array<Peaks, 10> kPeaks = {{
      {"H100 PCIe", 51200, 378000, 756000},
      {"H100", 66900, 494700, 989400},  // SXM
      {"H200", 66900, 494700, 989400},
      {"GH200", 66900, 494700, 989400},
      {"A100", 19500, 156000, 312000},
      {"A10G", 31200, 0, 0},
      {"L40S", 91600, 183000, 362050},
      {"L4", 30300, 60000, 121000},
      {"RTX 4090", 82600, 0, 0},
      {"V100", 15700, 0, 0},
  }};
  if (backend_name.rfind("cuda", 0) != 0) return std::nullopt;
  for (const Peaks& p : kPeaks) {
    if (backend_name.find(p.name) == std::string::npos) continue;
    const double peak = precision == "bf16" ? p.bf16 : precision == "tf32" ? p.tf32 : p.fp32;
    return peak > 0 ? std::optional<double>(peak) : std::nullopt;
  }
  return std::nullopt;
}

std::string format_progress_fields(double eta_seconds, std::optional<double> mfu) {
  return "eta:" + format_duration(eta_seconds) +
         (mfu ? " mfu:" + printf_string("%.1f%%", 100.0 * *mfu) : std::string());
}

std::string unknown_peak_note(const std::string& backend_name) {
  return "mfu: the peak of " + backend_name +
         " is not known; set log.peak_gflops to one rank's peak GFLOP/s (e.g. --set "
         "log.peak_gflops=1000) to see it on each training line";
}

std::string format_stats_line(int64_t step, int64_t total, double grad_norm,
                              std::optional<int64_t> peak_mem_bytes,
                              std::optional<int64_t> live_mem_bytes) {
  const auto mib = [](std::optional<int64_t> b) {
    return b ? printf_string("%.1fMiB", static_cast<double>(*b) / (1 << 20)) : std::string("n/a");
  };
  return "step:" + std::to_string(step) + "/" + std::to_string(total) +
         " grad_norm:" + printf_string("%.4f", grad_norm) + " peak_mem:" + mib(peak_mem_bytes) +
         " live_mem:" + mib(live_mem_bytes);
}

namespace {

// A text file sink that never throws. spdlog's file sink throws on a failed write, and the
// logger prints its `[*** LOG ERROR ***]` banner for every line after, leaving a cut-off line in
// the file. This one writes each line with one write(); when that fails (a full disk, a
// file-size limit) it cuts the file back to its last whole line, prints one warning naming the
// file and the reason, and writes nothing more: the run and its console go on.
class LineFileSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  // Takes the open file `fd` (core::open_output_file: no link is followed).
  LineFileSink(std::string path, int fd) : path_(std::move(path)), fd_(fd) {
    size_ = ::lseek(fd_, 0, SEEK_END);
  }
  ~LineFileSink() override {
    if (fd_ >= 0) ::close(fd_);
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (fd_ < 0) return;
    spdlog::memory_buf_t line;
    formatter_->format(msg, line);
    size_t done = 0;
    while (done < line.size()) {
      const ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return stop(n < 0 ? std::strerror(errno) : "no progress");
      done += static_cast<size_t>(n);
    }
    size_ += static_cast<off_t>(line.size());
  }
  void flush_() override {}  // every line is written at once

 private:
  void stop(const std::string& why) {
    const bool cut = size_ >= 0 && ::ftruncate(fd_, size_) == 0;
    ::close(fd_);
    fd_ = -1;
    // Not through spdlog: this runs inside the logger.
    std::fprintf(stderr,
                 "warning: cannot write the log file %s (%s): it %s; the run goes on, the console "
                 "shows every line\n",
                 path_.c_str(), why.c_str(),
                 cut ? "ends with its last whole line" : "may end mid-line");
    std::fflush(stderr);
  }

  std::string path_;
  int fd_ = -1;
  off_t size_ = 0;  // bytes of whole lines in the file
};

}  // namespace

LogFile::LogFile(const std::string& path, bool append) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  sink_ = std::make_shared<LineFileSink>(
      path, core::open_output_file(path, O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC),
                                   "the log file"));
  sink_->set_pattern("%v");
  sink_->set_level(spdlog::level::info);
  spdlog::default_logger()->sinks().push_back(sink_);
  spdlog::default_logger()->flush_on(spdlog::level::info);  // a killed run keeps its lines
}

LogFile::~LogFile() {
  auto& sinks = spdlog::default_logger()->sinks();
  sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  sink_->flush();
}

}  // namespace engine
