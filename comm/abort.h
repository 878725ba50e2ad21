// Failure policy of a multi-rank job: a rank that fails takes the whole job down within seconds,
// saying which rank failed and why, instead of leaving the other ranks blocked in a collective.
#pragma once

#include <functional>
#include <string>

namespace comm {

// Prints "rank R: <message>" to stderr and calls MPI_Abort(MPI_COMM_WORLD, 1) (or exits with 1
// when MPI is not running). Never returns.
[[noreturn]] void abort_job(const std::string& message);

// Runs fn; an exception escaping it aborts the job through abort_job(e.what()).
// Returns fn's result otherwise. Use it around the body of main.
int run_guarded(const std::function<int()>& fn);

// std::set_terminate handler doing the same for exceptions that escape elsewhere (other threads,
// noexcept functions). Installed by MpiSession.
void install_abort_on_terminate();

}  // namespace comm
