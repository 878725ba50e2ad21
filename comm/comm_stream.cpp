#include "comm/comm_stream.h"

#include <exception>
#include <future>

namespace comm {

struct CommStream::Task {
  std::function<void()> op;
  std::promise<void> done;
};

namespace {

class StreamWork final : public Work {
 public:
  StreamWork(std::future<void> done, CommStats* stats) : done_(std::move(done)), stats_(stats) {}
  ~StreamWork() override {
    if (done_.valid()) done_.wait();  // the operation's buffers must outlive it
  }
  void wait() override {
    if (!done_.valid()) return;
    if (stats_) {
      ScopedWait timer(*stats_);
      done_.wait();
    }
    done_.get();  // rethrows the operation's error
  }
  bool test() override {
    if (!done_.valid()) return true;
    if (done_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
    done_.get();
    return true;
  }

 private:
  std::future<void> done_;
  CommStats* stats_;
};

}  // namespace

CommStream::CommStream() : thread_([this] { run(); }) {}

CommStream::~CommStream() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

std::unique_ptr<Work> CommStream::submit(std::function<void()> op, CommStats* wait_stats) {
  auto task = std::make_shared<Task>();
  task->op = std::move(op);
  auto work = std::make_unique<StreamWork>(task->done.get_future(), wait_stats);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
  }
  wake_.notify_one();
  return work;
}

void CommStream::run() {
  for (;;) {
    std::shared_ptr<Task> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    // The operation (and what it captured) is destroyed before its Work completes, so a waiter
    // sees its buffers freed.
    try {
      task->op();
      task->op = nullptr;
      task->done.set_value();
    } catch (...) {
      task->op = nullptr;
      task->done.set_exception(std::current_exception());
    }
  }
}

}  // namespace comm
