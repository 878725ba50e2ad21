// WatchedCommunicator: a Communicator that forwards every call to another one and marks each
// collective's start and end for a Watchdog (a blocking call around the call, an async one
// around its Work's wait). Its stats() are the wrapped communicator's.
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/watchdog.h"

namespace comm {

class WatchedCommunicator final : public Communicator {
 public:
  WatchedCommunicator(Communicator& inner, Watchdog& watchdog);

  core::Device device() const override { return inner_.device(); }
  std::string name() const override { return inner_.name(); }

  std::unique_ptr<Work> all_reduce_async(float* buf, int64_t count, ReduceOp op) override;
  void all_reduce(float* buf, int64_t count, ReduceOp op) override;
  void all_reduce(double* buf, int64_t count, ReduceOp op) override;
  void all_reduce(int64_t* buf, int64_t count, ReduceOp op) override;
  void all_reduce_on_device(double* buf, int64_t count, ReduceOp op) override;
  std::unique_ptr<Work> reduce_scatter_async(const float* send, float* recv,
                                             std::span<const int64_t> counts, ReduceOp op) override;
  void reduce_scatter(const float* send, float* recv, std::span<const int64_t> counts,
                      ReduceOp op) override;
  std::unique_ptr<Work> all_gather_async(const float* send, float* recv,
                                         std::span<const int64_t> counts) override;
  void all_gather(const float* send, float* recv, std::span<const int64_t> counts) override;
  std::unique_ptr<Work> broadcast_async(float* buf, int64_t count, int root) override;
  using Communicator::broadcast;
  void broadcast(double* buf, int64_t count, int root) override;
  void broadcast_bytes(void* buf, int64_t bytes, int root) override;
  void barrier() override;
  // The sub-communicator is not watched.
  std::unique_ptr<Communicator> split(int color, int key) override;
  void copy_local(void* dst, const void* src, size_t bytes) override;

  // One set of counters: what the trainer and the ZeRO state record (comm_wait_ms, a
  // communication thread's counts) lands beside the wrapped communicator's own records.
  const CommStats& stats() const override { return inner_.stats(); }
  CommStats& stats() override { return inner_.stats(); }

 private:
  // Runs `call` marked as collective `what`.
  template <typename Call>
  auto watched(const char* what, Call&& call);
  std::unique_ptr<Work> watch_work(const char* what, std::unique_ptr<Work> work);

  Communicator& inner_;
  Watchdog& watchdog_;
};

}  // namespace comm
