#include "comm/abort.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <string>

namespace comm {

namespace {

int world_rank_or_minus_one() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return -1;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

void terminate_handler() {
  std::string message = "terminate called without an active exception";
  if (std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      message = ex.what();
    } catch (...) {
      message = "unknown exception";
    }
  }
  abort_job(message);
}

}  // namespace

void abort_job(const std::string& message) {
  int rank = world_rank_or_minus_one();
  std::fprintf(stderr, "rank %d: %s\n", rank, message.c_str());
  std::fflush(stderr);
  if (rank >= 0) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

int run_guarded(const std::function<int()>& fn) {
  try {
    return fn();
  } catch (const std::bad_alloc& e) {
    abort_job(std::string("out of memory (") + e.what() +
              "): the model, batch or data do not fit this machine; lower model sizes, "
              "train.micro_batch or the number of ranks per machine");
  } catch (const std::exception& e) {
    abort_job(e.what());
  } catch (...) {
    abort_job("unknown exception");
  }
}

void install_abort_on_terminate() {
  std::set_terminate(terminate_handler);
}

}  // namespace comm
