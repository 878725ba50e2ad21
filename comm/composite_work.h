// Work handles built from other handles: a sequence waited together, and a follow-up step run
// on the host once an operation has completed (unpacking, copying out of a scratch buffer).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "comm/communicator.h"

namespace comm {

// Waits for every member; test() is true once all are done.
class WorkGroup final : public Work {
 public:
  void add(std::unique_ptr<Work> work) {
    if (work) works_.push_back(std::move(work));
  }
  void wait() override;
  bool test() override;

 private:
  std::vector<std::unique_ptr<Work>> works_;
};

// Runs `then` exactly once after `first` completed (in wait() or a successful test()), then
// destroys it. Resources the operation needs (scratch tensors) are kept alive by capturing them
// in `then`, and are freed as soon as the work completes.
class ThenWork final : public Work {
 public:
  ThenWork(std::unique_ptr<Work> first, std::function<void()> then)
      : first_(std::move(first)), then_(std::move(then)) {}
  ~ThenWork() override;
  void wait() override;
  bool test() override;

 private:
  void finish();

  std::unique_ptr<Work> first_;
  std::function<void()> then_;
  bool done_ = false;
};

// A Work that is already complete (operations that needed no communication).
class DoneWork final : public Work {
 public:
  void wait() override {}
  bool test() override { return true; }
};

}  // namespace comm
