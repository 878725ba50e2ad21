// The files a run writes in its folders are opened without following a link (the e2e case
// log_links checks the refusal before a run; these check the open itself, which also catches a
// link planted after that check) and must be regular files.
#include "core/output_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <spdlog/spdlog.h>

#include "engine/console_log.h"
#include "engine/metrics.h"
#include "engine/run_lock.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using test_util::error_of;

namespace {

fs::path fresh_dir(const std::string& name) {
  return test_util::fresh_dir("run_file_" + name);
}

using test_util::text_of;

TEST(RunFile, EveryWriterRefusesALinkAndLeavesItsTargetAlone) {
  const fs::path dir = fresh_dir("links");
  const fs::path outside = dir / "outside.txt";
  const auto plant = [&](const fs::path& link) {
    std::ofstream(outside) << "precious\n";
    fs::remove(link);
    fs::create_symlink(outside, link);
    return "is a symbolic link (to " + outside.string() + ")";
  };
  const fs::path log = dir / "log.txt", metrics = dir / "metrics.jsonl", copy = dir / "config.yaml";
  std::string why = plant(log);
  EXPECT_NE(error_of([&] {
              engine::LogFile f(log.string(), false);
            }).find("the log file " + log.string() + " " + why),
            std::string::npos);
  EXPECT_NE(error_of([&] { engine::LogFile f(log.string(), true); }).find(why), std::string::npos);
  why = plant(metrics);
  EXPECT_NE(error_of([&] {
              engine::MetricsWriter w(metrics.string(), -1);
            }).find("the metrics file " + metrics.string() + " " + why),
            std::string::npos);
  EXPECT_NE(error_of([&] { engine::MetricsWriter w(metrics.string(), 5); }).find(why),
            std::string::npos);
  why = plant(copy);
  EXPECT_NE(error_of([&] {
              core::write_output_file(copy.string(), "x: 1\n", "the config copy");
            }).find("the config copy " + copy.string() + " " + why),
            std::string::npos);
  why = plant(dir / ".engine.lock");
  EXPECT_NE(error_of([&] {
              engine::RunLock lock({dir.string()}, engine::RunLock::Mode::Exclusive, 0.0);
            }).find("the run lock " + (dir / ".engine.lock").string() + " " + why),
            std::string::npos);
  EXPECT_EQ(text_of(outside), "precious\n");
  EXPECT_TRUE(fs::is_symlink(log) && fs::is_symlink(metrics) && fs::is_symlink(copy));
  fs::remove_all(dir);
}

TEST(RunFile, FifoAndFolderAreRefusedWithoutWaiting) {
  const fs::path dir = fresh_dir("kinds");
  const fs::path fifo = dir / "log.txt";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  EXPECT_NE(error_of([&] {
              engine::LogFile f(fifo.string(), false);
            }).find("the log file " + fifo.string() + " is not a regular file (it is a FIFO)"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              core::check_output_file(fifo.string(), "the log file");
            }).find("(it is a FIFO)"),
            std::string::npos);
  fs::create_directories(dir / "metrics.jsonl");
  EXPECT_NE(error_of([&] {
              engine::MetricsWriter w((dir / "metrics.jsonl").string(), -1);
            }).find("the metrics file"),
            std::string::npos);
  // A regular file, or none yet, is fine.
  EXPECT_EQ(error_of([&] { core::check_output_file((dir / "none").string(), "x"); }), "(no error)");
  core::write_output_file((dir / "config.yaml").string(), "a: 1\n", "the config copy");
  core::write_output_file((dir / "config.yaml").string(), "b\n", "the config copy");
  EXPECT_EQ(text_of(dir / "config.yaml"), "b\n");
  fs::remove_all(dir);
}

// After a `cp -al` snapshot of a run folder, a resume rewrote the snapshot: log.txt, config.yaml,
// trace.json and metrics.jsonl were written through their hard links. Each run file is a file of
// its own once written (the snapshot keeps what it held); the lock files are refused instead.
TEST(RunFile, HardLinkedRunFilesBecomeFilesOfTheirOwn) {
  const fs::path dir = fresh_dir("hard"), snap = fresh_dir("hard_snapshot");
  const fs::path log = dir / "log.txt", metrics = dir / "metrics.jsonl", copy = dir / "config.yaml";
  std::ofstream(log) << "step:1/4 train_loss:9.0\n";
  std::ofstream(metrics) << "{\"step\":1}\n{\"step\":2}\n";
  std::ofstream(copy) << "old: 1\n";
  for (const fs::path& f : {log, metrics, copy})
    fs::create_hard_link(f, snap / f.filename());
  {
    engine::LogFile f(log.string(), /*append=*/true);
    spdlog::info("step:2/4 train_loss:8.0");
  }
  { engine::MetricsWriter w(metrics.string(), 1); }
  core::write_output_file(copy.string(), "new: 1\n", "the config copy");
  EXPECT_EQ(text_of(snap / "log.txt"), "step:1/4 train_loss:9.0\n");
  EXPECT_EQ(text_of(snap / "metrics.jsonl"), "{\"step\":1}\n{\"step\":2}\n");
  EXPECT_EQ(text_of(snap / "config.yaml"), "old: 1\n");
  EXPECT_NE(text_of(log).find("step:1/4 train_loss:9.0\nstep:2/4 train_loss:8.0"),
            std::string::npos)
      << text_of(log);
  EXPECT_EQ(text_of(metrics), "{\"step\":1}\n");
  EXPECT_EQ(text_of(copy), "new: 1\n");
  for (const fs::path& f : {log, metrics, copy})
    EXPECT_EQ(fs::hard_link_count(f), 1u) << f;
  fs::remove_all(dir);
  fs::remove_all(snap);
}

}  // namespace
