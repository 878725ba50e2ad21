// The CPU backend's timing family (core/ops/timing.h): the steady clock.
#include <chrono>

#include "core/cpu/cpu_backend.h"

namespace core {

TimeMark CpuBackend::mark() {
  TimeMark m;
  m.host_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch())
          .count();
  return m;
}

double CpuBackend::elapsed_ms(const TimeMark& from, const TimeMark& to) {
  return to.host_ms - from.host_ms;
}

}  // namespace core
