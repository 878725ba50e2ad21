// The SOAP family across ranks: TpRekls (gather-all and distributed eigh) equals REKLS bit for
// bit at this world size, on the tp_rekls golden data (Shard(0), Shard(1) and replicated
// parameters), and equally over the staged device collectives; SOAP-family state resumes bit for
// bit with the state sharded like the parameters.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <memory>

#include "apps/optim_replay/golden_case.h"
#include "comm/communicator.h"
#include "comm/staged_communicator.h"
#include "core/backend.h"

namespace {

// The world communicator, made on first use (main is tests/comm/mpi_main.cpp).
comm::Communicator& world() {
  static std::unique_ptr<comm::Communicator> w = comm::make_mpi_world();
  return *w;
}

bool bitwise_equal(const core::Tensor& a, const core::Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// The file's data stepped by `groups` instead of the file's own translation.
replay::GoldenCase with_groups(const std::string& file, const std::string& groups) {
  replay::GoldenCase g = replay::load_golden(std::string(ENGINE_GOLDEN_DIR) + file);
  g.groups = YAML::Load(groups);
  return g;
}

const char* const kHyper = "lr: 0.01, eps: 0.1, weight_decay: 0.01";

// The tp_rekls golden data stepped by TpRekls with Shard(0), Shard(1) and replicated parameters
// (sizes that divide 1, 2, 4 and 8 ranks).
replay::GoldenCase tp_rekls_case(const char* distributed_eigh) {
  const std::string tp =
      std::string("optimizer: tp_rekls, ") + kHyper + ", distributed_eigh: " + distributed_eigh;
  return with_groups("/tp_rekls/tp_rekls_ws2.safetensors",
                     "- {params: [col], partition_dim: 0, " + tp + "}\n" +
                         "- {params: [row], partition_dim: 1, " + tp + "}\n" +
                         "- {params: [rep], partition_dim: none, " + tp + "}");
}

// Steps a and b through every step of `golden`, expecting the same bits after each.
void expect_same_trajectory(replay::Replayer& a, replay::Replayer& b,
                            const replay::GoldenCase& golden, const std::string& what) {
  comm::Communicator& comm = world();
  for (int64_t t = 1; t <= golden.steps; ++t) {
    a.step(t);
    b.step(t);
    for (const auto& p : golden.params)
      EXPECT_TRUE(bitwise_equal(a.full(p.name), b.full(p.name)))
          << what << ", step " << t << ", " << p.name << ", rank " << comm.rank() << " of "
          << comm.size();
  }
}

TEST(TpRekls, EqualsReklsBitForBit) {
  const replay::GoldenCase rekls =
      with_groups("/tp_rekls/tp_rekls_ws2.safetensors",
                  std::string("- {params: ['*'], optimizer: rekls, ") + kHyper + "}");
  for (const char* mode : {"false", "true"}) {
    const replay::GoldenCase tp_case = tp_rekls_case(mode);
    replay::Replayer a(tp_case, world());
    replay::Replayer b(rekls, world());
    expect_same_trajectory(a, b, tp_case, std::string("distributed_eigh ") + mode);
  }
}

// TpRekls over the staged device collectives (comm.device_collectives: mpi, which a GPU run uses
// to share one GPU between ranks): the gathers and the distributed eigh's broadcasts staged
// through the backend's copies give the plain MPI communicator's trajectory bit for bit.
TEST(TpRekls, OverStagedDeviceCollectivesEqualsPlainMpi) {
  const std::unique_ptr<comm::Communicator> staged =
      comm::make_staged(world(), core::cpu_backend());
  for (const char* mode : {"false", "true"}) {
    const replay::GoldenCase tp_case = tp_rekls_case(mode);
    replay::Replayer a(tp_case, *staged);
    replay::Replayer b(tp_case, world());
    expect_same_trajectory(a, b, tp_case, std::string("staged, distributed_eigh ") + mode);
  }
}

void check_resume(const replay::GoldenCase& golden, int64_t stop_after) {
  comm::Communicator& comm = world();
  replay::Replayer whole(golden, comm);
  whole.run();
  replay::Replayer first(golden, comm);
  for (int64_t t = 1; t <= stop_after; ++t)
    first.step(t);
  const std::string dir =
      std::filesystem::temp_directory_path() / ("soap_state_" + std::to_string(::getppid()));
  if (comm.rank() == 0) std::filesystem::create_directories(dir);
  comm.barrier();
  const std::string path = dir + "/rank" + std::to_string(comm.rank()) + ".safetensors";
  replay::save_state(first.optimizers().state(), path);
  replay::Replayer resumed(golden, comm);
  for (const auto& p : golden.params)
    resumed.set_full(p.name, first.full(p.name));
  resumed.optimizers().load_state(replay::load_state(path));
  for (int64_t t = stop_after + 1; t <= golden.steps; ++t)
    resumed.step(t);
  for (const auto& p : golden.params)
    EXPECT_TRUE(bitwise_equal(resumed.full(p.name), whole.full(p.name)))
        << golden.path << " " << p.name << " rank " << comm.rank();
  comm.barrier();
  if (comm.rank() == 0) std::filesystem::remove_all(dir);
}

TEST(SoapFamilyState, ResumeIsBitExact) {
  for (const char* file :
       {"/soap/soap_amortized_freq2_warmup1_qr.safetensors",
        "/soap/soap_reference_maxdim_1d.safetensors", "/rekls/rekls_2d.safetensors",
        "/stacked_soap/stacked_soap_3d_square_stack.safetensors"})
    check_resume(replay::load_golden(std::string(ENGINE_GOLDEN_DIR) + file), 3);
  const std::string tp = "optimizer: tp_rekls, lr: 0.01, eps: 0.1";
  check_resume(with_groups("/tp_rekls/tp_rekls_ws2.safetensors",
                           "- {params: [col], partition_dim: 0, " + tp + "}\n" +
                               "- {params: [row], partition_dim: 1, " + tp + "}\n" +
                               "- {params: [rep], " + tp + "}"),
               2);
}

}  // namespace
