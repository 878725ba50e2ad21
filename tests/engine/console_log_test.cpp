// Console additions and the text log file: durations, the GPU peak table, the extra fields after
// modded-nanogpt's, the statistics line, and LogFile's tee (new file vs appended on resume).
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "engine/console_log.h"

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(ConsoleLog, DurationsPeaksAndFields) {
  EXPECT_EQ(engine::format_duration(44.6), "45s");
  EXPECT_EQ(engine::format_duration(185), "3m05s");
  EXPECT_EQ(engine::format_duration(3725), "1h02m");
  EXPECT_EQ(engine::format_duration(-3), "0s");
  EXPECT_EQ(engine::gpu_peak_gflops("cuda:0 (NVIDIA H100 80GB HBM3)"), 66900.0);
  EXPECT_EQ(engine::gpu_peak_gflops("cuda:1 (NVIDIA H100 PCIe)"), 51200.0);
  EXPECT_EQ(engine::gpu_peak_gflops("cuda:0 (Some Future GPU)"), std::nullopt);
  EXPECT_EQ(engine::gpu_peak_gflops("cpu (OpenBLAS, 2 threads)"), std::nullopt);
  EXPECT_EQ(engine::format_progress_fields(185, 0.4123), "eta:3m05s mfu:41.2%");
  EXPECT_EQ(engine::format_progress_fields(5, std::nullopt), "eta:5s mfu:unknown");
  EXPECT_EQ(engine::format_stats_line(120, 2000, 0.81234, int64_t{3} << 20, std::nullopt),
            "step:120/2000 grad_norm:0.8123 peak_mem:3.0MiB live_mem:n/a");
}

TEST(ConsoleLog, LogFileTeesLinesStartsAnewOrAppends) {
  const std::string dir = (std::filesystem::temp_directory_path() / "engine_console_log").string();
  std::filesystem::remove_all(dir);
  const std::string path = dir + "/log.txt";
  {
    engine::LogFile log(path, /*append=*/false);
    spdlog::info("first run line");
  }
  spdlog::info("not in the file");
  {
    engine::LogFile log(path, /*append=*/true);
    spdlog::info("resumed line");
  }
  EXPECT_EQ(read_all(path), "first run line\nresumed line\n");
  {
    engine::LogFile log(path, /*append=*/false);
    spdlog::info("fresh run");
  }
  EXPECT_EQ(read_all(path), "fresh run\n");
  std::filesystem::remove_all(dir);
}

}  // namespace
