#include "engine/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "tests/test_util.h"

namespace {

TEST(Metrics, ConsoleLinesInModdedOrder) {
  EXPECT_EQ(engine::format_val_line(120, 2000, 4.90314, 81234.4),
            "step:120/2000 val_loss:4.9031 train_time:81234ms step_avg:676.95ms");
  EXPECT_EQ(engine::format_train_line(121, 2000, 4.81201, 81911.0, 6e-4, 12104.2),
            "step:121/2000 train_loss:4.8120 train_time:81911ms step_avg:676.95ms lr:6.0e-04 "
            "tok/s:12104");
  // Step 0 validation divides by max(step, 1).
  EXPECT_EQ(engine::format_val_line(0, 10, 10.0, 0.0),
            "step:0/10 val_loss:10.0000 train_time:0ms step_avg:0.00ms");
}

TEST(Metrics, JsonObjectPerStep) {
  engine::StepRecord r;
  r.step = 3;
  r.train_loss = 2.5;
  r.lr = 0.001;
  r.grad_norm = NAN;
  r.tokens = 768;
  r.comm_bytes = {{"all_reduce", 40}, {"all_gather", 8}};
  r.phase_ms = {{"forward_backward", 1.5}};
  EXPECT_EQ(engine::to_json(r),
            "{\"step\":3,\"train_loss\":2.5,\"lr\":0.001,\"grad_norm\":null,\"tokens\":768,"
            "\"elapsed_ms\":0,\"step_ms\":0,\"tokens_per_s\":0,\"gflops\":0,"
            "\"comm_bytes\":{\"all_reduce\":40,\"all_gather\":8},"
            "\"phase_ms\":{\"forward_backward\":1.5}}");
  EXPECT_EQ(engine::json_line_step(engine::to_json(r)), 3);
  EXPECT_EQ(engine::json_line_step("{}"), -1);
  r.peak_mem_bytes = 4096;
  r.live_mem_bytes = 1024;
  const std::string json = engine::to_json(r);
  EXPECT_EQ(json.substr(json.size() - 45), ",\"peak_mem_bytes\":4096,\"live_mem_bytes\":1024}");
  r.comm_wait_ms = 2.25;
  EXPECT_NE(engine::to_json(r).find("\"comm_bytes\":{\"all_reduce\":40,\"all_gather\":8},"
                                    "\"comm_wait_ms\":2.25,\"phase_ms\""),
            std::string::npos);
  r.device_phase_ms = {{"forward_backward", 1.25}, {"clip", 0.5}};
  EXPECT_NE(engine::to_json(r).find("\"phase_ms\":{\"forward_backward\":1.5},"
                                    "\"device_phase_ms\":{\"forward_backward\":1.25,\"clip\":0.5},"
                                    "\"peak_mem_bytes\""),
            std::string::npos);
  r.moe_expert_rows = {3, 5, 0, 8};
  const std::string moe = engine::to_json(r);
  EXPECT_TRUE(moe.ends_with(",\"moe_expert_rows\":[3,5,0,8]}")) << moe;
}

// Every group's lr after the first group's, the MFU after the FLOP rate (when the peak is known).
TEST(Metrics, JsonHasGroupLrAndMfu) {
  engine::StepRecord r;
  r.step = 1;
  r.lr = 0.02;
  r.group_lr = {0.02, 0.01};
  r.gflops = 3;
  r.mfu = 0.25;
  const std::string json = engine::to_json(r);
  EXPECT_NE(json.find("\"lr\":0.02,\"group_lr\":[0.02,0.01],\"grad_norm\""), std::string::npos)
      << json;
  EXPECT_NE(json.find("\"gflops\":3,\"mfu\":0.25,"), std::string::npos) << json;
}

TEST(Metrics, WriterDropsStepsAfterTheResumePoint) {
  auto path = (std::filesystem::temp_directory_path() / "engine_metrics_test.jsonl").string();
  {
    engine::MetricsWriter w(path, -1);
    for (int64_t s = 1; s <= 5; ++s) {
      engine::StepRecord r;
      r.step = s;
      w.write(r);
    }
  }
  {
    engine::MetricsWriter w(path, 3);  // resumed from the checkpoint of step 3
    engine::StepRecord r;
    r.step = 4;
    w.write(r);
  }
  std::ifstream in(path);
  std::vector<int64_t> steps;
  std::string line;
  while (std::getline(in, line))
    steps.push_back(engine::json_line_step(line));
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3, 4}));
  std::filesystem::remove(path);
}

// A line cut off by a crash or a full disk is dropped when a resumed run reopens the file: it
// used to be kept (its step parses) and the file stayed invalid JSON Lines for good.
TEST(Metrics, ResumedWriterDropsACutOffLine) {
  auto path = (std::filesystem::temp_directory_path() / "engine_metrics_cut.jsonl").string();
  {
    std::ofstream out(path);
    for (int64_t s = 1; s <= 3; ++s) {
      engine::StepRecord r;
      r.step = s;
      out << engine::to_json(r) << '\n';
    }
    out << "{\"step\":4,\"train_lo";
  }
  { engine::MetricsWriter w(path, 10); }
  std::ifstream in(path);
  std::vector<int64_t> steps;
  for (std::string line; std::getline(in, line);)
    steps.push_back(engine::json_line_step(line));
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2, 3}));
  std::filesystem::remove(path);
}

// A full disk (here /dev/full: every write fails with ENOSPC) no longer ends the run: the writer
// warns once, naming the file, and stops writing.
TEST(Metrics, FullDiskStopsTheFileNotTheRun) {
  engine::MetricsWriter w("/dev/full", -1);
  engine::StepRecord r;
  r.step = 1;
  testing::internal::CaptureStdout();
  EXPECT_NO_THROW(w.write(r));
  EXPECT_TRUE(w.stopped());
  r.step = 2;
  EXPECT_NO_THROW(w.write(r));
  const std::string out = testing::internal::GetCapturedStdout();
  EXPECT_EQ(test_util::count_of(out,
                                "cannot write the metrics file /dev/full (No space left on "
                                "device) at step 1"),
            1)
      << out;
}

// A write cut short by a file-size limit (as by a full disk) leaves whole lines only: the file is
// cut back to its last whole line. Run in a child process, whose limit ends with it.
TEST(Metrics, FailedWriteLeavesWholeLinesOnly) {
  auto path = (std::filesystem::temp_directory_path() / "engine_metrics_full.jsonl").string();
  const int status = test_util::run_with_file_size_limit(1000, [&] {
    engine::MetricsWriter w(path, -1);
    for (int64_t s = 1; s <= 50 && !w.stopped(); ++s) {
      engine::StepRecord r;
      r.step = s;
      r.train_loss = 1.0 / static_cast<double>(s);
      w.write(r);
    }
    return w.stopped() ? 0 : 3;
  });
  ASSERT_EQ(status, 0) << "the child failed (3: the limit was never reached)";
  std::ifstream in(path);
  int64_t expected = 1;
  for (std::string line; std::getline(in, line); ++expected) {
    EXPECT_EQ(engine::json_line_step(line), expected) << line;
    EXPECT_EQ(line.back(), '}') << line;
  }
  EXPECT_GT(expected, 2);
  EXPECT_LE(std::filesystem::file_size(path), 1000u);
  std::filesystem::remove(path);
}

}  // namespace
