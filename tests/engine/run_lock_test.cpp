#include "engine/run_lock.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/check.h"

namespace fs = std::filesystem;
using engine::RunLock;

namespace {

std::string fresh_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / ("engine_run_lock_" + name);
  fs::remove_all(dir);
  return dir.string();
}

}  // namespace

TEST(RunLock, ASecondExclusiveRunIsRefusedNamingTheFolder) {
  const std::string dir = fresh_dir("exclusive");
  RunLock first({dir}, RunLock::Mode::Exclusive, 0.0);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    RunLock second({dir}, RunLock::Mode::Exclusive, 0.3);
    FAIL() << "two exclusive locks on one folder";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("another engine run is still using " + dir),
              std::string::npos)
        << e.what();
  }
  // It waited for the holder before giving up.
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(250));
}

TEST(RunLock, SharedHoldersBlockAnExclusiveOneUntilTheyRelease) {
  const std::string dir = fresh_dir("shared");
  {
    RunLock rank0({dir}, RunLock::Mode::Exclusive, 0.0);
    rank0.downgrade();
    RunLock rank1({dir}, RunLock::Mode::Shared, 0.0);  // the run's other ranks join
    EXPECT_THROW(RunLock({dir}, RunLock::Mode::Exclusive, 0.1), core::Error);
  }
  RunLock next_run({dir}, RunLock::Mode::Exclusive, 0.0);  // all holders gone
  EXPECT_TRUE(fs::exists(fs::path(dir) / ".engine.lock"));
}

TEST(RunLock, LocksEveryFolderAndCreatesIt) {
  const std::string a = fresh_dir("a"), b = fresh_dir("b") + "/nested";
  RunLock lock({a, b}, RunLock::Mode::Exclusive, 0.0);
  EXPECT_TRUE(fs::is_directory(b));
  EXPECT_THROW(RunLock({b}, RunLock::Mode::Shared, 0.05), core::Error);
}

// log.dir equal to checkpoint.dir (or one folder under two names) is one folder to lock: the run
// used to wait on its own lock for 60 s and then blame "another engine run".
TEST(RunLock, OneFolderNamedTwiceIsLockedOnce) {
  const std::string a = fresh_dir("same");
  const auto start = std::chrono::steady_clock::now();
  {
    RunLock lock({a, a + "/", a + "/../same"}, RunLock::Mode::Exclusive, 1.0);
    lock.downgrade();
    RunLock rank1({a, a}, RunLock::Mode::Shared, 1.0);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
}

// Lock files that are links to one outside file (planted, or left by a copy of a run folder): the
// run waited 60 s on its own lock and then blamed another run that did not exist. Refused at
// once, naming the lock file.
TEST(RunLock, LockFilesThatAreLinksAreRefusedAtOnce) {
  const std::string a = fresh_dir("link_a"), b = fresh_dir("link_b");
  const std::string outside = fresh_dir("link_target");
  fs::create_directories(a);
  fs::create_directories(b);
  fs::create_directories(outside);
  const std::string target = outside + "/lock";
  { std::ofstream(target) << ""; }
  fs::create_symlink(target, a + "/.engine.lock");
  fs::create_symlink(target, b + "/.engine.lock");
  const auto start = std::chrono::steady_clock::now();
  std::string msg;
  try {
    RunLock lock({a, b}, RunLock::Mode::Exclusive, 5.0);
  } catch (const core::Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("the run lock " + a + "/.engine.lock is a symbolic link"), std::string::npos)
      << msg;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));

  fs::remove(a + "/.engine.lock");
  fs::remove(b + "/.engine.lock");
  fs::create_hard_link(target, a + "/.engine.lock");
  fs::create_hard_link(target, b + "/.engine.lock");
  msg.clear();
  try {
    RunLock lock({a, b}, RunLock::Mode::Exclusive, 5.0);
  } catch (const core::Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("the run lock " + a + "/.engine.lock is not a plain file of its own"),
            std::string::npos)
      << msg;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(4));
}
