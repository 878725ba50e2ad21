#include "optim/soap/phase_times.h"

#include <chrono>
#include <ctime>
#include <exception>

namespace optim {

namespace {

double clock_seconds(clockid_t id) {
  timespec ts{};
  clock_gettime(id, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace

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

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double process_cpu_seconds() {
  return clock_seconds(CLOCK_PROCESS_CPUTIME_ID);
}

double thread_cpu_seconds() {
  return clock_seconds(CLOCK_THREAD_CPUTIME_ID);
}

PhaseTimer::PhaseTimer(SoapPhaseTimes* times, core::Backend& backend, SoapPhase phase,
                       bool this_thread)
    : times_(times), backend_(backend), phase_(phase), this_thread_(this_thread) {
  if (!times_) return;
  backend_.synchronize();
  wall0_ = wall_seconds();
  cpu0_ = cpu_seconds();
}

PhaseTimer::~PhaseTimer() noexcept(false) {
  if (!times_ || std::uncaught_exceptions() > 0) return;
  backend_.synchronize();
  times_->add(phase_, wall_seconds() - wall0_, cpu_seconds() - cpu0_);
}

double PhaseTimer::cpu_seconds() const {
  return this_thread_ ? thread_cpu_seconds() : process_cpu_seconds();
}

}  // namespace optim
