// Console additions and the text log file: durations, the GPU peak table, the extra fields after
// modded-nanogpt's, the statistics line, and LogFile's tee (new file vs appended on resume).
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "engine/console_log.h"
#include "tests/test_util.h"

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
  EXPECT_EQ(engine::gpu_peak_gflops("cuda:0 (NVIDIA H200)", "tf32"), 494700.0);
  EXPECT_EQ(engine::gpu_peak_gflops("cuda:0 (NVIDIA H200)", "bf16"), 989400.0);
  EXPECT_EQ(engine::gpu_peak_gflops("cuda:0 (NVIDIA A100-SXM4-80GB)", "bf16"), 312000.0);
  EXPECT_EQ(engine::gpu_peak_gflops("cuda:0 (NVIDIA V100)", "bf16"), std::nullopt);
  EXPECT_EQ(engine::gpu_peak_gflops("cuda:0 (Some Future GPU)"), std::nullopt);
  EXPECT_EQ(engine::gpu_peak_gflops("cpu (OpenBLAS, 2 threads)"), std::nullopt);
  EXPECT_EQ(engine::format_progress_fields(185, 0.4123), "eta:3m05s mfu:41.2%");
  EXPECT_EQ(engine::format_progress_fields(5, std::nullopt), "eta:5s");
  EXPECT_EQ(engine::unknown_peak_note("cpu (OpenBLAS, 2 threads)"),
            "mfu: the peak of cpu (OpenBLAS, 2 threads) is not known; set log.peak_gflops to one "
            "rank's peak GFLOP/s (e.g. --set log.peak_gflops=1000) to see it on each training "
            "line");
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

// spdlog's file sink threw on a full disk, and the logger printed its LOG ERROR banner for every
// line after, leaving a cut-off line in the file. Now: one warning naming the file, then silence;
// the console goes on.
TEST(ConsoleLog, LogFileOnAFullDiskWarnsOnceAndStops) {
  engine::LogFile log("/dev/full", /*append=*/true);
  testing::internal::CaptureStderr();
  EXPECT_NO_THROW(spdlog::info("a line the disk has no room for"));
  EXPECT_NO_THROW(spdlog::info("and another"));
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(test_util::count_of(err,
                                "cannot write the log file /dev/full (No space left on "
                                "device)"),
            1)
      << err;
  EXPECT_EQ(err.find("LOG ERROR"), std::string::npos) << err;
}

// A write cut short by a file-size limit leaves the file at its last whole line.
TEST(ConsoleLog, LogFileCutShortKeepsWholeLines) {
  const std::string path =
      (std::filesystem::temp_directory_path() / "engine_console_log_full.txt").string();
  const int status = test_util::run_with_file_size_limit(100, [&] {
    engine::LogFile log(path, /*append=*/false);
    for (int i = 0; i < 20; ++i)
      spdlog::info("line {} of the run", i);
    return 0;
  });
  ASSERT_EQ(status, 0);
  const std::string text = read_all(path);
  EXPECT_GT(text.size(), 0u);
  EXPECT_LE(text.size(), 100u);
  EXPECT_EQ(text.back(), '\n') << text;
  EXPECT_EQ(text.find("line 0 of the run\nline 1 of the run\n"), 0u) << text;
  std::filesystem::remove(path);
}

}  // namespace
