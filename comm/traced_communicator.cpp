#include "comm/traced_communicator.h"

namespace comm {

namespace {

// An async collective's handle: the span from issue to completion goes on the issuing thread's
// in-flight track when the collective is found done.
class TracedWork final : public Work {
 public:
  TracedWork(std::unique_ptr<Work> inner, core::Tracer& tracer, const char* what, int track,
             double issued_us)
      : inner_(std::move(inner)),
        tracer_(tracer),
        what_(what),
        wait_name_(std::string("wait ") + what),
        track_(track),
        issued_us_(issued_us) {}
  // Unwaited, the wrapped Work's destructor waits for the collective; its span is not recorded.
  ~TracedWork() override = default;
  void wait() override {
    if (done_) return;
    {
      core::TraceScope waiting(&tracer_, "wait", wait_name_);
      inner_->wait();
    }
    finish();
  }
  bool test() override {
    if (!done_ && inner_->test()) finish();
    return done_;
  }

 private:
  void finish() {
    done_ = true;
    tracer_.record(what_, core::kNoIndex, "comm", track_, issued_us_, core::Tracer::now_us());
  }

  std::unique_ptr<Work> inner_;
  core::Tracer& tracer_;
  const char* what_;
  std::string wait_name_;
  int track_;
  double issued_us_;
  bool done_ = false;
};

}  // namespace

TracedCommunicator::TracedCommunicator(Communicator& inner, core::Tracer& tracer)
    : Communicator(inner.rank(), inner.size()), inner_(inner), tracer_(tracer) {}

TracedCommunicator::TracedCommunicator(std::unique_ptr<Communicator> inner, core::Tracer& tracer)
    : Communicator(inner->rank(), inner->size()),
      owned_(std::move(inner)),
      inner_(*owned_),
      tracer_(tracer) {}

template <typename Call>
void TracedCommunicator::traced(const char* what, Call&& call) {
  core::TraceScope span(&tracer_, "comm", what);
  call();
}

template <typename Call>
std::unique_ptr<Work> TracedCommunicator::traced_async(const char* what, Call&& call) {
  if (!tracer_.active()) return call();
  if (blocking_async_) {
    core::TraceScope span(&tracer_, "comm", what);
    return call();
  }
  const double issued = core::Tracer::now_us();
  std::unique_ptr<Work> work = call();
  return std::make_unique<TracedWork>(std::move(work), tracer_, what, tracer_.in_flight_track(),
                                      issued);
}

std::unique_ptr<Work> TracedCommunicator::all_reduce_async(float* buf, int64_t count, ReduceOp op) {
  return traced_async("all_reduce", [&] { return inner_.all_reduce_async(buf, count, op); });
}
void TracedCommunicator::all_reduce(float* buf, int64_t count, ReduceOp op) {
  traced("all_reduce", [&] { inner_.all_reduce(buf, count, op); });
}
void TracedCommunicator::all_reduce(double* buf, int64_t count, ReduceOp op) {
  traced("all_reduce", [&] { inner_.all_reduce(buf, count, op); });
}
void TracedCommunicator::all_reduce_on_device(double* buf, int64_t count, ReduceOp op) {
  traced("all_reduce", [&] { inner_.all_reduce_on_device(buf, count, op); });
}
void TracedCommunicator::all_reduce(int64_t* buf, int64_t count, ReduceOp op) {
  traced("all_reduce", [&] { inner_.all_reduce(buf, count, op); });
}
std::unique_ptr<Work> TracedCommunicator::reduce_scatter_async(const float* send, float* recv,
                                                               std::span<const int64_t> counts,
                                                               ReduceOp op) {
  return traced_async("reduce_scatter",
                      [&] { return inner_.reduce_scatter_async(send, recv, counts, op); });
}
void TracedCommunicator::reduce_scatter(const float* send, float* recv,
                                        std::span<const int64_t> counts, ReduceOp op) {
  traced("reduce_scatter", [&] { inner_.reduce_scatter(send, recv, counts, op); });
}
std::unique_ptr<Work> TracedCommunicator::all_gather_async(const float* send, float* recv,
                                                           std::span<const int64_t> counts) {
  return traced_async("all_gather", [&] { return inner_.all_gather_async(send, recv, counts); });
}
void TracedCommunicator::all_gather(const float* send, float* recv,
                                    std::span<const int64_t> counts) {
  traced("all_gather", [&] { inner_.all_gather(send, recv, counts); });
}
std::unique_ptr<Work> TracedCommunicator::broadcast_async(float* buf, int64_t count, int root) {
  return traced_async("broadcast", [&] { return inner_.broadcast_async(buf, count, root); });
}
void TracedCommunicator::broadcast(double* buf, int64_t count, int root) {
  traced("broadcast", [&] { inner_.broadcast(buf, count, root); });
}
void TracedCommunicator::broadcast_bytes(void* buf, int64_t bytes, int root) {
  traced("broadcast", [&] { inner_.broadcast_bytes(buf, bytes, root); });
}
void TracedCommunicator::barrier() {
  traced("barrier", [&] { inner_.barrier(); });
}
std::unique_ptr<Communicator> TracedCommunicator::split(int color, int key) {
  return std::make_unique<TracedCommunicator>(inner_.split(color, key), tracer_);
}
void TracedCommunicator::copy_local(void* dst, const void* src, size_t bytes) {
  inner_.copy_local(dst, src, bytes);
}
void TracedCommunicator::set_blocking_async(bool on) {
  blocking_async_ = on;
  inner_.set_blocking_async(on);
}

}  // namespace comm
