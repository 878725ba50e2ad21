// RunLock: one run at a time per output folder.
//
// A killed job's ranks can outlive their mpirun by a few seconds; a run resumed into the same
// folders meanwhile would have two writers on one metrics file and one checkpoint tree. Every
// rank of a run holds a shared flock on `<dir>/.engine.lock`; a new run's rank 0 first takes it
// exclusively, which waits until every rank of any earlier run has exited (the kernel drops a
// dead process's locks), then downgrades it to shared so its own ranks can join.
#pragma once

#include <string>
#include <vector>

namespace engine {

class RunLock {
 public:
  enum class Mode { Exclusive, Shared };
  // Locks each folder (created if missing; a folder named twice, e.g. log.dir equal to
  // checkpoint.dir, is locked once), waiting up to `wait_seconds` for other holders; throws
  // core::Error naming the folder when they do not go away.
  RunLock(const std::vector<std::string>& dirs, Mode mode, double wait_seconds);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

  // Exclusive -> shared, so the other ranks of this run can take their shared locks.
  void downgrade();

 private:
  std::vector<std::string> dirs_;
  std::vector<int> fds_;
};

}  // namespace engine
