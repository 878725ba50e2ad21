// Optimizer state save -> load -> continue equals an uninterrupted replay bit for bit, at the
// world size ctest runs this with (state sharded like the parameters: one file per rank).
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "apps/optim_replay/golden_case.h"
#include "comm/communicator.h"
#include "comm/mpi_session.h"

namespace {

comm::Communicator* g_comm = nullptr;

bool bitwise_equal(const core::Tensor& a, const core::Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

void check_resume(const std::string& file, int64_t stop_after) {
  comm::Communicator& comm = *g_comm;
  const replay::GoldenCase golden = replay::load_golden(std::string(ENGINE_GOLDEN_DIR) + file);
  replay::Replayer whole(golden, comm);
  whole.run();

  replay::Replayer first(golden, comm);
  for (int64_t t = 1; t <= stop_after; ++t)
    first.step(t);
  const std::string dir =
      std::filesystem::temp_directory_path() / ("optim_state_" + std::to_string(::getppid()));
  if (comm.rank() == 0) std::filesystem::create_directories(dir);
  comm.barrier();
  const std::string path = dir + "/rank" + std::to_string(comm.rank()) + ".safetensors";
  replay::save_state(first.optimizers().state(), path);

  replay::Replayer resumed(golden, comm);
  replay::Replayer fresh(golden, comm);  // same parameters, no state: must differ
  for (const auto& p : golden.params) {
    resumed.set_full(p.name, first.full(p.name));
    fresh.set_full(p.name, first.full(p.name));
  }
  resumed.optimizers().load_state(replay::load_state(path));
  for (int64_t t = stop_after + 1; t <= golden.steps; ++t) {
    resumed.step(t);
    fresh.step(t);
  }
  bool any_fresh_differs = false;
  for (const auto& p : golden.params) {
    EXPECT_TRUE(bitwise_equal(resumed.full(p.name), whole.full(p.name)))
        << file << " " << p.name << " rank " << comm.rank();
    any_fresh_differs |= !bitwise_equal(fresh.full(p.name), whole.full(p.name));
  }
  EXPECT_TRUE(any_fresh_differs) << file << ": dropping the state should change the result";
  comm.barrier();
  if (comm.rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace

TEST(OptimizerState, AdamResumeIsBitExact) {
  check_resume("/adamw/eps_and_multipliers.safetensors", 3);
}

TEST(OptimizerState, MuonResumeIsBitExact) {
  check_resume("/muon/split_qkv_multipliers.safetensors", 2);
}

TEST(OptimizerState, NorMuonResumeIsBitExact) {
  check_resume("/normuon/split_qkv_multipliers.safetensors", 3);
}

TEST(OptimizerState, ReplayWithinToleranceAtThisWorldSize) {
  for (const char* file : {"/adamw/distadam_basic.safetensors", "/muon/tall_wide.safetensors"}) {
    const replay::GoldenCase golden = replay::load_golden(std::string(ENGINE_GOLDEN_DIR) + file);
    replay::Replayer r(golden, *g_comm);
    for (const auto& d : r.run())
      EXPECT_LE(d.max_abs, golden.suggested_atol) << file << d.param;
  }
}

int main(int argc, char** argv) {
  comm::MpiSession session(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int rc = 0;
  {
    std::unique_ptr<comm::Communicator> world = comm::make_mpi_world();
    g_comm = world.get();
    rc = RUN_ALL_TESTS();
    int64_t worst = rc;
    world->all_reduce(&worst, 1, comm::ReduceOp::Max);
    rc = static_cast<int>(worst);
  }
  return rc;
}
