// The CPU cores a process may run on (its affinity mask) against its OpenMP threads.
//
// mpirun binds every rank to one core when it starts at most two ranks (Open MPI's default,
// --bind-to core): a rank given two OpenMP threads then runs them both on that core, about half
// as fast as unbound, and nothing says so. The engine prints the cores of every rank in its banner
// and one warning line naming the fix when a rank's threads outnumber its cores.
#pragma once

#include <span>
#include <string>
#include <vector>

namespace core {

// The CPUs in this process's affinity mask (sched_getaffinity), ascending.
std::vector<int> affinity_cpus();

// CPUs as ranges, "0-3,6" (ascending input; "" when empty).
std::string cpu_list(std::span<const int> cpus);

// One rank's threads and the cores it may use.
struct RankCpus {
  int threads = 1;
  std::vector<int> cpus;
};

// "2 threads on cores 0-1" (the banner's words for one rank).
std::string describe(const RankCpus& r);

// One warning line for the ranks (index = rank) whose OpenMP threads outnumber their cores,
// naming the launch that fixes it; "" when every rank has a core per thread.
std::string oversubscription_warning(std::span<const RankCpus> ranks);

}  // namespace core
