// core/cpu_affinity: this process's cores, the banner's words and the one warning line.
#include "core/cpu_affinity.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <thread>

TEST(CpuAffinity, ListsTheCoresOfTheAffinityMask) {
  const std::vector<int> cpus = core::affinity_cpus();
  ASSERT_FALSE(cpus.empty());
  EXPECT_TRUE(std::is_sorted(cpus.begin(), cpus.end()));
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(static_cast<int>(cpus.size()), CPU_COUNT(&set));
  EXPECT_LE(cpus.size(), std::thread::hardware_concurrency());
}

TEST(CpuAffinity, WritesCoresAsRanges) {
  EXPECT_EQ(core::cpu_list(std::vector<int>{}), "");
  EXPECT_EQ(core::cpu_list(std::vector<int>{3}), "3");
  EXPECT_EQ(core::cpu_list(std::vector<int>{0, 1, 2, 3}), "0-3");
  EXPECT_EQ(core::cpu_list(std::vector<int>{0, 1, 4, 6, 7}), "0-1,4,6-7");
  EXPECT_EQ(core::describe({2, {0, 1}}), "2 threads on cores 0-1");
  EXPECT_EQ(core::describe({1, {5}}), "1 thread on core 5");
}

TEST(CpuAffinity, WarnsOnceWhenThreadsOutnumberCores) {
  // A core per thread (or more): nothing to say.
  const std::vector<core::RankCpus> fine = {{2, {0, 1}}, {1, {2}}, {2, {3, 4, 5}}};
  EXPECT_EQ(core::oversubscription_warning(fine), "");
  // One rank, two threads bound to one core (mpirun -np 1 binds to a core).
  const std::vector<core::RankCpus> one = {{2, {0}}};
  EXPECT_EQ(core::oversubscription_warning(one),
            "warning: rank 0 of 1 has more OpenMP threads than cores (2 threads on core 0), so "
            "its threads share cores: launch with `mpirun --bind-to none`, or `mpirun --map-by "
            "slot:PE=2` to bind each rank to 2 cores");
  // Several ranks: one line naming them all and the first one's numbers.
  const std::vector<core::RankCpus> many = {{1, {0}}, {4, {1}}, {4, {2, 3}}, {4, {4, 5, 6, 7}}};
  const std::string w = core::oversubscription_warning(many);
  EXPECT_EQ(w.find('\n'), std::string::npos);
  EXPECT_NE(w.find("ranks 1-2 of 4 have more OpenMP threads than cores (rank 1: 4 threads on "
                   "core 1)"),
            std::string::npos)
      << w;
  EXPECT_NE(w.find("--map-by slot:PE=4"), std::string::npos) << w;
}
