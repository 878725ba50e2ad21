// Where a SOAP-family step spends its time, for apps/bench_optim's breakdown. Off unless an
// optimizer is given a SoapPhaseTimes (Soap::set_phase_times, TpRekls::set_phase_times); then each
// timed section synchronises the backend at both ends, so device work counts in the phase that
// issued it.
//
// Phases: factors (the GEMMs forming G G^T, G^T G or KL-Shampoo's statistics, and the lerp into
// the factors), solver (eigh, or the K Q products and QRs of power iteration), sort (Rayleigh
// quotients, the descending sort and the column permutations it drives, the eigh output's
// reversal), rotate (the first moment M out of the old basis and into the new one), update (the
// gradient into the basis, Adam, the direction out of it, weight decay and the parameter step).
// Solver and sort are timed per factor on the thread that refreshes it (the CPU spreads the
// factors over its threads), wall and that thread's CPU time, summed over the factors: with
// several threads they add up to more than the step's wall time. The other phases are timed
// around the whole phase: wall, and the CPU time of every thread.
#pragma once

#include <array>

#include "core/backend.h"

namespace optim {

enum class SoapPhase { Factors, Solver, Sort, Rotate, Update };
constexpr int kSoapPhases = 5;
const char* soap_phase_name(SoapPhase phase);

struct SoapPhaseTimes {
  std::array<double, kSoapPhases> wall_s{};
  std::array<double, kSoapPhases> cpu_s{};

  void add(SoapPhase phase, double wall, double cpu) {
    wall_s[static_cast<int>(phase)] += wall;
    cpu_s[static_cast<int>(phase)] += cpu;
  }
  void add(const SoapPhaseTimes& other);
};

// Adds the time between construction and destruction to `phase` (nothing when times is null),
// the backend synchronised first at both ends: wall time, and the CPU time of the process or, for
// work on one thread of a parallel region (`this_thread`), of the calling thread. The
// synchronisation at the end may throw (a device error), unless an exception is already on its
// way out.
class PhaseTimer {
 public:
  PhaseTimer(SoapPhaseTimes* times, core::Backend& backend, SoapPhase phase,
             bool this_thread = false);
  ~PhaseTimer() noexcept(false);
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  double cpu_seconds() const;

  SoapPhaseTimes* times_;
  core::Backend& backend_;
  SoapPhase phase_;
  bool this_thread_;
  double wall0_ = 0, cpu0_ = 0;
};

}  // namespace optim
