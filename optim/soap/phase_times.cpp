#include "optim/soap/phase_times.h"

#include <exception>

#include "core/clock.h"

namespace optim {

const char* soap_phase_name(SoapPhase phase) {
  switch (phase) {
    case SoapPhase::Factors:
      return "factors";
    case SoapPhase::Solver:
      return "solver";
    case SoapPhase::Sort:
      return "sort";
    case SoapPhase::Rotate:
      return "rotate";
    case SoapPhase::Update:
      return "update";
  }
  return "?";
}

void SoapPhaseTimes::add(const SoapPhaseTimes& other) {
  for (int i = 0; i < kSoapPhases; ++i) {
    wall_s[i] += other.wall_s[i];
    cpu_s[i] += other.cpu_s[i];
  }
}

PhaseTimer::PhaseTimer(SoapPhaseTimes* times, core::Backend& backend, SoapPhase phase,
                       bool this_thread)
    : times_(times), backend_(backend), phase_(phase), this_thread_(this_thread) {
  if (!times_) return;
  backend_.synchronize();
  wall0_ = core::wall_seconds();
  cpu0_ = cpu_seconds();
}

PhaseTimer::~PhaseTimer() noexcept(false) {
  if (!times_ || std::uncaught_exceptions() > 0) return;
  backend_.synchronize();
  times_->add(phase_, core::wall_seconds() - wall0_, cpu_seconds() - cpu0_);
}

double PhaseTimer::cpu_seconds() const {
  return this_thread_ ? core::thread_cpu_seconds() : core::process_cpu_seconds();
}

}  // namespace optim
