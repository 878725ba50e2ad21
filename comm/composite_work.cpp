#include "comm/composite_work.h"

#include <exception>

namespace comm {

void WorkGroup::wait() {
  for (auto& w : works_)
    w->wait();
}

bool WorkGroup::test() {
  bool all = true;
  for (auto& w : works_)
    all = w->test() && all;  // test every member to drive progress
  return all;
}

ThenWork::~ThenWork() {
  if (done_) return;
  try {
    wait();
  } catch (const std::exception&) {
    // Destructors cannot report; an explicit wait() surfaces the error.
  }
}

void ThenWork::wait() {
  if (done_) return;
  if (first_) first_->wait();
  finish();
}

bool ThenWork::test() {
  if (done_) return true;
  if (first_ && !first_->test()) return false;
  finish();
  return true;
}

void ThenWork::finish() {
  done_ = true;
  first_.reset();
  // Run, then drop the step: scratch buffers it captured are freed as soon as the work is done,
  // not when the handle dies.
  std::function<void()> then = std::move(then_);
  then_ = nullptr;
  if (then) then();
}

}  // namespace comm
