#include "engine/stop_signal.h"

#include <csignal>
#include <cstdint>
#include <cstring>

namespace engine {

namespace {

volatile std::sig_atomic_t g_signal = 0;

extern "C" void record_stop_signal(int signal) {
  g_signal = signal;
}

}  // namespace

void install_stop_signals() {
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = record_stop_signal;
  sigemptyset(&action.sa_mask);
  // MPI and file I/O continue (the step boundary checks the flag); the handler is reset on use,
  // so a second signal of the kind terminates at once.
  action.sa_flags = SA_RESTART | SA_RESETHAND;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
}

int stop_signal() {
  return g_signal;
}

int agreed_stop_signal(comm::Communicator& comm) {
  int64_t signal = stop_signal();
  comm.all_reduce(&signal, 1, comm::ReduceOp::Max);
  return static_cast<int>(signal);
}

StoppedBySignal::StoppedBySignal(int signal, int64_t step)
    : std::runtime_error(std::string("stopped by ") + (signal == SIGINT ? "SIGINT" : "SIGTERM") +
                         " after step " + std::to_string(step)),
      signal_(signal) {}

}  // namespace engine
