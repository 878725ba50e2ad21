#include "core/cpu_affinity.h"

#include <sched.h>

#include <algorithm>

#include "core/check.h"

namespace core {

std::vector<int> affinity_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  ENGINE_CHECK(sched_getaffinity(0, sizeof(set), &set) == 0,
               "sched_getaffinity failed: cannot read the cores this process may use");
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

std::string cpu_list(std::span<const int> cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1)
      ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(cpus[j]);
    }
    i = j + 1;
  }
  return out;
}

std::string describe(const RankCpus& r) {
  return std::to_string(r.threads) + (r.threads == 1 ? " thread" : " threads") +
         (r.cpus.size() == 1 ? " on core " : " on cores ") + cpu_list(r.cpus);
}

std::string oversubscription_warning(std::span<const RankCpus> ranks) {
  std::vector<int> short_of_cores;
  int threads = 1;
  for (size_t r = 0; r < ranks.size(); ++r)
    if (ranks[r].threads > static_cast<int>(ranks[r].cpus.size())) {
      short_of_cores.push_back(static_cast<int>(r));
      threads = std::max(threads, ranks[r].threads);
    }
  if (short_of_cores.empty()) return "";
  const bool one = short_of_cores.size() == 1;
  const int first = short_of_cores.front();
  return "warning: " + std::string(one ? "rank " : "ranks ") + cpu_list(short_of_cores) + " of " +
         std::to_string(ranks.size()) + (one ? " has" : " have") +
         " more OpenMP threads than cores (" + (one ? "" : "rank " + std::to_string(first) + ": ") +
         describe(ranks[static_cast<size_t>(first)]) + "), so " + (one ? "its" : "their") +
         " threads share cores: launch with `mpirun --bind-to none`, or `mpirun --map-by slot:PE=" +
         std::to_string(threads) + "` to bind each rank to " + std::to_string(threads) + " cores";
}

}  // namespace core
