// Failure policy of a multi-rank job: an error is printed once and ends the whole job within
// seconds with a non-zero status, instead of leaving the other ranks blocked in a collective.
//
// An error every rank finds (a config or batch error, a refused checkpoint: every rank reads the
// same files and reaches the same verdict) is collective: the ranks agree on it over a private
// duplicate of MPI_COMM_WORLD, rank 0 prints its message once, and every rank exits with the same
// status through MPI_Finalize (no MPI_ABORT banner). An error on only some ranks (a file only
// one node cannot read, a crash) is not: those ranks print "rank R: message" and MPI_Abort the
// job, since the others may be blocked in a collective they will never leave.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

namespace comm {

// Exit status of an error that escapes run_guarded: std::exception -> kExitFailed, an
// ExitStatusError -> its own.
inline constexpr int kExitFailed = 1;

// An error that ends the job with a given exit status (e.g. 2 for input refused before any work).
class ExitStatusError : public std::runtime_error {
 public:
  ExitStatusError(const std::string& message, int status)
      : std::runtime_error(message), status_(status) {}
  int status() const { return status_; }

 private:
  int status_;
};

// How long a failing rank waits for the other ranks to report the same error before it treats
// the error as its own and aborts the job.
inline constexpr double kAgreeSeconds = 10.0;

// Prints "rank R: <message>" to stderr and calls MPI_Abort(MPI_COMM_WORLD, 1) (or exits with 1
// when MPI is not running). Never returns.
[[noreturn]] void abort_job(const std::string& message);

// Every rank passes the error it found in a phase all ranks run ("" for none) and learns
// whether the job may go on. No rank failed: true. Every rank failed: rank 0 prints its error
// once, and every rank gets false. Some ranks failed: those abort the job naming themselves
// (abort_job); the others get false. A single process prints its error and gets false.
bool agree_no_error(const std::string& error);

// The end of a job for an error raised on this rank: waits up to kAgreeSeconds for every other
// rank to report an error too (collective: rank 0 prints its message once, and the agreed
// status, the largest given, is returned for every rank to exit with); otherwise aborts the job
// through abort_job. A single process prints the message and returns `status`.
int end_with_error(const std::string& message, int status);

// Runs fn; an exception escaping it ends the job through end_with_error(e.what(), status: an
// ExitStatusError's own, else kExitFailed). Returns fn's result otherwise, or the status. Use it
// around the body of main.
int run_guarded(const std::function<int()>& fn);

// Set up by MpiSession (collective over MPI_COMM_WORLD): the private communicator the ranks
// agree on errors over, and the std::set_terminate handler that aborts the job through
// abort_job for exceptions escaping elsewhere (other threads, noexcept functions).
void install_failure_policy();
// Frees that communicator (before MPI_Finalize).
void release_failure_policy();

}  // namespace comm
