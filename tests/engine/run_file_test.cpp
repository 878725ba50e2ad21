// The files a run writes in its folders are opened without following a link (the e2e case
// log_links checks the refusal before a run; these check the open itself, which also catches a
// link planted after that check) and must be regular files.
#include "engine/run_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "engine/console_log.h"
#include "engine/metrics.h"
#include "engine/run_lock.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;
using test_util::error_of;

namespace {

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("engine_run_file_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

std::string text_of(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

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
              engine::write_run_file(copy.string(), "x: 1\n", "the config copy");
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
              engine::check_run_file(fifo.string(), "the log file");
            }).find("(it is a FIFO)"),
            std::string::npos);
  fs::create_directories(dir / "metrics.jsonl");
  EXPECT_NE(error_of([&] {
              engine::MetricsWriter w((dir / "metrics.jsonl").string(), -1);
            }).find("the metrics file"),
            std::string::npos);
  // A regular file, or none yet, is fine.
  EXPECT_EQ(error_of([&] { engine::check_run_file((dir / "none").string(), "x"); }), "(no error)");
  engine::write_run_file((dir / "config.yaml").string(), "a: 1\n", "the config copy");
  engine::write_run_file((dir / "config.yaml").string(), "b\n", "the config copy");
  EXPECT_EQ(text_of(dir / "config.yaml"), "b\n");
  fs::remove_all(dir);
}

}  // namespace
