// CommStream: a queue of communication operations run one at a time, in submission order, by
// a thread of its own: the CPU counterpart of a NCCL stream. On the CPU, Open MPI progresses a
// nonblocking collective only inside MPI calls (this build has no asynchronous progress thread:
// `ompi_info` reports "OMPI progress: no"), so a collective started during the backward pass
// would wait for the next MPI call of the computing thread. An operation queued here makes
// progress while the computing thread computes.
//
// Operations that call MPI must use a communicator that no other thread uses at the same time
// (a duplicate of the computing thread's one, Communicator::split), and MPI must provide
// MPI_THREAD_MULTIPLE (MpiSession asks for it).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "comm/communicator.h"

namespace comm {

class CommStream {
 public:
  CommStream();
  // Runs what is still queued, then joins the thread.
  ~CommStream();
  CommStream(const CommStream&) = delete;
  CommStream& operator=(const CommStream&) = delete;

  // Queues `op`; the returned Work is complete once op has run. Work::wait() rethrows what op
  // threw, and adds the time it blocked to `wait_stats` (when given).
  std::unique_ptr<Work> submit(std::function<void()> op, CommStats* wait_stats = nullptr);

 private:
  struct Task;
  void run();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Task>> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace comm
