// Op family: Timing: marks in the order of the work issued to the device, and the milliseconds
// between two of them (the trainer's log.device_timing, bench_model --device cuda). A part of the
// Backend interface (core/backend.h); implemented per device in core/cpu/timing.cpp (the host
// clock: a CPU op is done when its call returns) and core/cuda/timing.cu (events on the stream).
#pragma once

#include <memory>

namespace core {

// A point in the device's order of work. Copies share it; it is freed with the last copy.
struct TimeMark {
  double host_ms = 0;           // CPU: the steady clock when the mark was made
  std::shared_ptr<void> event;  // CUDA: the event recorded on the backend's stream
};

class TimingOps {
 public:
  virtual ~TimingOps() = default;

  // A mark after everything issued so far.
  virtual TimeMark mark() = 0;
  // The milliseconds from `from` to `to` (made in that order); waits until `to` is reached.
  virtual double elapsed_ms(const TimeMark& from, const TimeMark& to) = 0;
};

}  // namespace core
