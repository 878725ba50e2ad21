#include "comm/watched_communicator.h"

namespace comm {

namespace {

// An async collective's handle: waiting on it is the collective's wait.
class WatchedWork final : public Work {
 public:
  WatchedWork(std::unique_ptr<Work> inner, Watchdog& watchdog, const char* what)
      : inner_(std::move(inner)), watchdog_(watchdog), what_(what) {}
  ~WatchedWork() override {
    if (!done_) wait();
  }
  void wait() override {
    if (done_) return;
    watchdog_.enter(what_);
    inner_->wait();
    watchdog_.leave();
    done_ = true;
  }
  bool test() override {
    if (!done_) done_ = inner_->test();
    return done_;
  }

 private:
  std::unique_ptr<Work> inner_;
  Watchdog& watchdog_;
  const char* what_;
  bool done_ = false;
};

}  // namespace

WatchedCommunicator::WatchedCommunicator(Communicator& inner, Watchdog& watchdog)
    : Communicator(inner.rank(), inner.size()), inner_(inner), watchdog_(watchdog) {}

template <typename Call>
auto WatchedCommunicator::watched(const char* what, Call&& call) {
  struct Mark {
    WatchedCommunicator& self;
    ~Mark() { self.watchdog_.leave(); }
  };
  watchdog_.enter(what);
  Mark mark{*this};
  return call();
}

std::unique_ptr<Work> WatchedCommunicator::watch_work(const char* what,
                                                      std::unique_ptr<Work> work) {
  return std::make_unique<WatchedWork>(std::move(work), watchdog_, what);
}

std::unique_ptr<Work> WatchedCommunicator::all_reduce_async(float* buf, int64_t count,
                                                            ReduceOp op) {
  return watch_work("all_reduce", inner_.all_reduce_async(buf, count, op));
}
void WatchedCommunicator::all_reduce(float* buf, int64_t count, ReduceOp op) {
  watched("all_reduce", [&] { inner_.all_reduce(buf, count, op); });
}
void WatchedCommunicator::all_reduce(double* buf, int64_t count, ReduceOp op) {
  watched("all_reduce", [&] { inner_.all_reduce(buf, count, op); });
}
void WatchedCommunicator::all_reduce_on_device(double* buf, int64_t count, ReduceOp op) {
  watched("all_reduce", [&] { inner_.all_reduce_on_device(buf, count, op); });
}
void WatchedCommunicator::all_reduce(int64_t* buf, int64_t count, ReduceOp op) {
  watched("all_reduce", [&] { inner_.all_reduce(buf, count, op); });
}
std::unique_ptr<Work> WatchedCommunicator::reduce_scatter_async(const float* send, float* recv,
                                                                std::span<const int64_t> counts,
                                                                ReduceOp op) {
  return watch_work("reduce_scatter", inner_.reduce_scatter_async(send, recv, counts, op));
}
void WatchedCommunicator::reduce_scatter(const float* send, float* recv,
                                         std::span<const int64_t> counts, ReduceOp op) {
  watched("reduce_scatter", [&] { inner_.reduce_scatter(send, recv, counts, op); });
}
std::unique_ptr<Work> WatchedCommunicator::all_gather_async(const float* send, float* recv,
                                                            std::span<const int64_t> counts) {
  return watch_work("all_gather", inner_.all_gather_async(send, recv, counts));
}
void WatchedCommunicator::all_gather(const float* send, float* recv,
                                     std::span<const int64_t> counts) {
  watched("all_gather", [&] { inner_.all_gather(send, recv, counts); });
}
std::unique_ptr<Work> WatchedCommunicator::broadcast_async(float* buf, int64_t count, int root) {
  return watch_work("broadcast", inner_.broadcast_async(buf, count, root));
}
void WatchedCommunicator::broadcast(double* buf, int64_t count, int root) {
  watched("broadcast", [&] { inner_.broadcast(buf, count, root); });
}
void WatchedCommunicator::broadcast_bytes(void* buf, int64_t bytes, int root) {
  watched("broadcast", [&] { inner_.broadcast_bytes(buf, bytes, root); });
}
void WatchedCommunicator::barrier() {
  watched("barrier", [&] { inner_.barrier(); });
}
std::unique_ptr<Communicator> WatchedCommunicator::split(int color, int key) {
  return watched("split", [&] { return inner_.split(color, key); });
}
void WatchedCommunicator::copy_local(void* dst, const void* src, size_t bytes) {
  inner_.copy_local(dst, src, bytes);
}

}  // namespace comm
