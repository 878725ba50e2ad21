#include "comm/abort.h"

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <string>
#include <thread>

namespace comm {

namespace {

// The ranks agree on errors over their own duplicate of MPI_COMM_WORLD, so that an agreement
// never matches a collective that other ranks are blocked in on the world communicator.
MPI_Comm g_agree = MPI_COMM_NULL;

bool mpi_running() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

int world_rank_or_minus_one() {
  if (!mpi_running()) return -1;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

// Several ranks to agree with, over g_agree; false for a single process (or MPI not running).
bool agreement_needed() {
  if (!mpi_running() || g_agree == MPI_COMM_NULL) return false;
  int size = 1;
  MPI_Comm_size(g_agree, &size);
  return size > 1;
}

struct Verdict {
  bool any_failed = false;
  bool all_failed = false;
  int status = 0;  // the largest status given
};

// One agreement: the max over ranks of {failed, -failed, status}. Returns false when it did not
// complete within timeout_s (< 0: waits as long as it takes).
bool exchange(bool failed, int status, double timeout_s, Verdict& out) {
  int send[3] = {failed ? 1 : 0, failed ? -1 : 0, status};
  int recv[3] = {0, 0, 0};
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Iallreduce(send, recv, 3, MPI_INT, MPI_MAX, g_agree, &request);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    int done = 0;
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) break;
    if (timeout_s >= 0 && std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  out.any_failed = recv[0] == 1;
  out.all_failed = recv[1] == -1;
  out.status = recv[2];
  return true;
}

void print_line(const std::string& message) {
  std::fprintf(stderr, "%s\n", message.c_str());
  std::fflush(stderr);
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
  const int rank = world_rank_or_minus_one();
  std::fprintf(stderr, "rank %d: %s\n", rank, message.c_str());
  std::fflush(stderr);
  if (rank >= 0) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

bool agree_no_error(const std::string& error) {
  if (!agreement_needed()) {
    if (!error.empty()) print_line(error);
    return error.empty();
  }
  Verdict v;
  // A failing rank waits a bounded time: a rank that never arrives makes the error its own.
  if (!exchange(!error.empty(), 0, error.empty() ? -1.0 : kAgreeSeconds, v)) abort_job(error);
  if (!v.any_failed) return true;
  if (!v.all_failed) {
    if (!error.empty()) abort_job(error);
    return false;
  }
  if (world_rank_or_minus_one() == 0) print_line(error);
  return false;
}

int end_with_error(const std::string& message, int status) {
  if (!agreement_needed()) {
    print_line(message);
    return status;
  }
  Verdict v;
  if (!exchange(true, status, kAgreeSeconds, v) || !v.all_failed) abort_job(message);
  if (world_rank_or_minus_one() == 0) print_line(message);
  return v.status;
}

int run_guarded(const std::function<int()>& fn) {
  try {
    return fn();
  } catch (const std::bad_alloc& e) {
    return end_with_error(std::string("out of memory (") + e.what() +
                              "): the model, batch or data do not fit this machine; lower model "
                              "sizes, train.micro_batch or the number of ranks per machine",
                          kExitFailed);
  } catch (const ExitStatusError& e) {
    return end_with_error(e.what(), e.status());
  } catch (const std::exception& e) {
    return end_with_error(e.what(), kExitFailed);
  } catch (...) {
    return end_with_error("unknown exception", kExitFailed);
  }
}

void install_failure_policy() {
  std::set_terminate(terminate_handler);
  if (mpi_running() && g_agree == MPI_COMM_NULL) MPI_Comm_dup(MPI_COMM_WORLD, &g_agree);
}

void release_failure_policy() {
  if (mpi_running() && g_agree != MPI_COMM_NULL) MPI_Comm_free(&g_agree);
  g_agree = MPI_COMM_NULL;
}

}  // namespace comm
