// SIGTERM / SIGINT as a request to stop at the next step boundary.
//
// The handlers only record the signal; the trainer asks stop_signal() between steps (the ranks
// agree with a max all-reduce, so a signal that reached one rank stops all of them at the same
// step), saves a checkpoint when checkpoint.on_signal is set, and the process exits with the
// shell's status for the signal (128 + signal: 143 for SIGTERM, 130 for SIGINT). A second signal
// of the same kind ends the process at once (the default action), for a run that does not reach
// a step boundary. mpirun (Open MPI 4.1) forwards SIGTERM and SIGINT to the ranks as SIGTERM and
// then exits 1 itself; a scheduler that signals the ranks gets their status from mpirun.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "comm/communicator.h"

namespace engine {

// Installs the handlers (idempotent).
void install_stop_signals();
// The stop signal received so far (SIGTERM or SIGINT), or 0.
int stop_signal();
// The same agreed by every rank (collective): the signal any rank received, or 0.
int agreed_stop_signal(comm::Communicator& comm);

// Thrown by the trainer after it stopped for a signal; main turns it into the exit status.
class StoppedBySignal : public std::runtime_error {
 public:
  // `step`: the last step done.
  StoppedBySignal(int signal, int64_t step);
  int signal() const { return signal_; }
  int exit_status() const { return 128 + signal_; }

 private:
  int signal_;
};

}  // namespace engine
