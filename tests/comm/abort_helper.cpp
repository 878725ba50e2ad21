// Failure injection for the abort tests. Rank 2 fails while every other rank blocks in a
// collective: mode "guarded", an exception escapes the body run by comm::run_guarded; mode
// "terminate", an exception escapes a noexcept function (std::terminate, the session's handler).
// Either way the job must end with non-zero status, the message and the failing rank. Mode
// "collective": every rank fails at the same point (as with a config error every rank reads);
// the job must end with the ExitStatusError's status 5 and the message printed once, by rank 0,
// without an abort.
#include <string>
#include <vector>

#include "comm/abort.h"
#include "comm/communicator.h"
#include "comm/mpi_session.h"
#include "core/check.h"

namespace {

void fail_noexcept() noexcept {
  ENGINE_FAIL("injected failure (terminate)");
}

}  // namespace

int main(int argc, char** argv) {
  comm::MpiSession session(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "guarded";
  return comm::run_guarded([&] {
    auto world = comm::make_mpi_world();
    std::vector<float> buf(1024, 1.0f);
    world->all_reduce(buf.data(), 1024, comm::ReduceOp::Sum);  // everyone is up
    if (mode == "collective")
      throw comm::ExitStatusError("injected failure (collective) seen by every rank", 5);
    if (world->rank() == 2 % world->size()) {
      if (mode == "terminate") fail_noexcept();
      ENGINE_FAIL("injected failure (guarded)");
    }
    world->all_reduce(buf.data(), 1024, comm::ReduceOp::Sum);  // blocks: rank 2 never joins
    world->barrier();
    return 0;
  });
}
