#include "engine/console_log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>

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

std::optional<double> gpu_peak_gflops(const std::string& backend_name) {
  // FP32 (non-tensor) dense peaks from the vendors' data sheets; more specific names first.
  static constexpr std::array<std::pair<const char*, double>, 10> kPeaks = {{
      {"H100 PCIe", 51200},
      {"H100", 66900},  // SXM
      {"H200", 66900},
      {"GH200", 66900},
      {"A100", 19500},
      {"A10G", 31200},
      {"L40S", 91600},
      {"L4", 30300},
      {"RTX 4090", 82600},
      {"V100", 15700},
  }};
  if (backend_name.rfind("cuda", 0) != 0) return std::nullopt;
  for (const auto& [name, peak] : kPeaks)
    if (backend_name.find(name) != std::string::npos) return peak;
  return std::nullopt;
}

std::string format_progress_fields(double eta_seconds, std::optional<double> mfu) {
  return "eta:" + format_duration(eta_seconds) +
         " mfu:" + (mfu ? printf_string("%.1f%%", 100.0 * *mfu) : std::string("unknown"));
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

LogFile::LogFile(const std::string& path, bool append) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  sink_ = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, /*truncate=*/!append);
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
