// Watchdog: ends a job whose collective waits too long for a rank, naming the collective and
// the ranks that did not arrive, instead of hanging forever (a rank stopped by SIGSTOP, stuck in
// a kernel, or blocked on a dead file system).
//
// The main thread marks each collective's start and end (enter/leave; WatchedCommunicator does
// this for every collective of a communicator). A helper thread per rank watches those marks
// and answers the other ranks' questions over its own duplicate of MPI_COMM_WORLD (hence
// MPI_THREAD_MULTIPLE). When this rank has been inside collective number k for longer than the
// timeout, its helper asks every other rank where it is, waits a grace period for the answers
// (answering the others' questions meanwhile), and aborts the job with one message: ranks that
// did not answer (stopped, dead, hung outside user code), ranks busy before collective k, and
// the ranks waiting in it. Only the lowest rank waiting in a collective reports, so the job ends
// with one message, not one per live rank. Collectives are numbered per rank in call order, which
// is the same on every rank of an SPMD program.
//
// Time for which the whole process was suspended (SIGSTOP of every rank, as Ctrl-Z or Slurm's
// job suspend does) is no rank's wait: the helper thread looks every 50 ms, so a gap of seconds
// between two looks means it was stopped too, and that gap is left out of the wait. A rank
// stopped alone is still found: the ranks waiting for it were not stopped.
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

namespace comm {

class Watchdog {
 public:
  // timeout_s <= 0, or MPI without MPI_THREAD_MULTIPLE: a no-op watchdog (enter/leave still
  // count). Collective over MPI_COMM_WORLD (duplicates it).
  explicit Watchdog(double timeout_s, double grace_s = 5.0);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  bool active() const { return thread_.joinable(); }
  // Main thread: collective `what` (a string literal) starts / ends.
  void enter(const char* what);
  void leave();

 private:
  struct Status {            // what a rank answers: where it is
    int64_t seq = 0;         // collectives entered so far
    int64_t inside = 0;      // 1 while inside collective `seq`
    int64_t elapsed_ms = 0;  // since it entered (inside) or left (outside) it
  };
  Status status() const;
  void loop();
  void serve_queries();
  // Aborts the job with the report, unless a lower rank waits in a collective too: then that
  // rank reports, and this one defers (one message per job).
  void report_or_defer(const Status& mine);

  double timeout_s_;
  double grace_s_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::atomic<int64_t> seq_{0};
  std::atomic<bool> inside_{false};
  std::atomic<const char*> what_{""};
  std::atomic<int64_t> since_ns_{0};
  std::atomic<int64_t> suspended_ns_{0};  // of the time since since_ns_: the process was stopped
  std::atomic<bool> stop_{false};
  int64_t deferred_until_ns_ = 0;  // helper thread only
  int64_t query_seq_ = 0;          // the question sent to the other ranks
  std::thread thread_;
};

}  // namespace comm
