#include "engine/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "core/check.h"
#include "core/output_file.h"

namespace engine {

namespace {

// The folders as created, each once: two names of one folder (log.dir equal to checkpoint.dir,
// or a path and its symlink) share one lock file, and a second flock of it from this process
// would wait on the first.
std::vector<std::string> distinct_folders(const std::vector<std::string>& dirs) {
  std::vector<std::string> out;
  std::vector<std::filesystem::path> seen;
  for (const auto& dir : dirs) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    const std::filesystem::path real =
        ec ? std::filesystem::path() : std::filesystem::canonical(dir, ec);
    ENGINE_CHECK(!ec, "cannot create the run folder " + dir + ": " + ec.message());
    if (std::find(seen.begin(), seen.end(), real) != seen.end()) continue;
    seen.push_back(real);
    out.push_back(dir);
  }
  return out;
}

}  // namespace

RunLock::RunLock(const std::vector<std::string>& dirs, Mode mode, double wait_seconds)
    : dirs_(distinct_folders(dirs)) {
  const int op = (mode == Mode::Exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(std::max(wait_seconds, 0.0));
  try {
    for (const auto& dir : dirs_) {
      const std::string path = (std::filesystem::path(dir) / ".engine.lock").string();
      // Not through a link: two lock files linked to one outside file made a run wait 60 s on
      // its own lock and then blame another run.
      const int fd =
          core::open_output_file(path, O_RDWR | O_CREAT, "the run lock", core::SharedFile::Refuse);
      fds_.push_back(fd);
      struct stat st {};
      ENGINE_CHECK(::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1,
                   "the run lock " + path +
                       " is not a plain file of its own (a hard link or no regular file); a lock "
                       "file is the engine's own (remove it)");
      while (::flock(fd, op) != 0) {
        ENGINE_CHECK(errno == EWOULDBLOCK || errno == EINTR,
                     "cannot lock " + path + ": " + std::strerror(errno));
        ENGINE_CHECK(std::chrono::steady_clock::now() < deadline,
                     "another engine run is still using " + dir + " (" + path +
                         " is locked); wait for it to exit or choose other log.dir / "
                         "checkpoint.dir");
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  } catch (...) {
    for (int fd : fds_)
      ::close(fd);
    throw;
  }
}

RunLock::~RunLock() {
  for (int fd : fds_)
    ::close(fd);
}

void RunLock::downgrade() {
  for (size_t i = 0; i < fds_.size(); ++i) {
    ENGINE_CHECK(::flock(fds_[i], LOCK_SH) == 0,
                 "cannot downgrade the run lock of " + dirs_[i] + ": " + std::strerror(errno));
  }
}

}  // namespace engine
