// TracedCommunicator: a Communicator that forwards every call to another one and, while its
// tracer is active, records each collective as a span (core/tracer.h): a blocking call on the
// calling thread's track from start to end; an async one on the calling thread's "in flight"
// track from issue to completion (the test() that found it done, or the end of its wait()), and
// the wait itself on the calling thread's track ("wait all_reduce"). After
// set_blocking_async (a communication thread's communicator) async calls complete in the call and
// are recorded as blocking ones. Inactive, a call costs one branch more than the wrapped one.
// Its stats() are the wrapped communicator's; its split() is traced too.
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "core/tracer.h"

namespace comm {

class TracedCommunicator final : public Communicator {
 public:
  TracedCommunicator(Communicator& inner, core::Tracer& tracer);
  // Owns `inner` (a split).
  TracedCommunicator(std::unique_ptr<Communicator> inner, core::Tracer& tracer);

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
  std::unique_ptr<Communicator> split(int color, int key) override;
  void copy_local(void* dst, const void* src, size_t bytes) override;
  void set_blocking_async(bool on) override;

  const CommStats& stats() const override { return inner_.stats(); }
  CommStats& stats() override { return inner_.stats(); }

 private:
  // Runs the blocking `call` as a span named `what`.
  template <typename Call>
  void traced(const char* what, Call&& call);
  // Issues the async `call` named `what`; its Work records the span when it completes.
  template <typename Call>
  std::unique_ptr<Work> traced_async(const char* what, Call&& call);

  std::unique_ptr<Communicator> owned_;
  Communicator& inner_;
  core::Tracer& tracer_;
};

}  // namespace comm
