// Optimizer state save -> load -> continue equals an uninterrupted replay bit for bit, at the
// world size ctest runs this with (state sharded like the parameters: one file per rank); golden
// files stored in BF16 and F16 replay as their f32 values; a file whose param_overrides name every
// parameter replays.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>

#include "apps/optim_replay/golden_case.h"
#include "comm/communicator.h"
#include "core/safetensors.h"

namespace {

// The world communicator, made on first use (main is tests/comm/mpi_main.cpp).
comm::Communicator& world() {
  static std::unique_ptr<comm::Communicator> w = comm::make_mpi_world();
  return *w;
}

bool bitwise_equal(const core::Tensor& a, const core::Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

void check_resume(const std::string& file, int64_t stop_after) {
  comm::Communicator& comm = world();
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
    replay::Replayer r(golden, world());
    for (const auto& d : r.run())
      EXPECT_TRUE(replay::passes(d, golden.suggested_atol)) << file << " " << d.param;
  }
}

// The pass rule fails a NaN and a value just above the tolerance, and passes one at it.
TEST(ReplayVerdict, NanAndJustAboveToleranceFail) {
  const double atol = 1e-6;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  auto diff = [](double max_abs) { return replay::Difference{1, "w", max_abs, max_abs}; };
  EXPECT_TRUE(replay::passes(diff(atol), atol));
  EXPECT_FALSE(replay::passes(diff(std::nextafter(atol, 1.0)), atol));
  EXPECT_FALSE(replay::passes(diff(nan), atol));
  EXPECT_FALSE(replay::passes(diff(std::numeric_limits<double>::infinity()), atol));
  // The worst of a list is the non-finite one, wherever it is (std::max(x, NaN) kept x).
  const replay::Difference worst =
      replay::worst_difference({diff(1e-9), {2, "nan_param", HUGE_VAL, HUGE_VAL}, diff(2e-9)});
  EXPECT_EQ(worst.param, "nan_param");
  EXPECT_FALSE(replay::passes(worst, atol));
}

// A NaN parameter in the middle of a replay is a difference of +infinity, not of zero.
TEST(ReplayVerdict, NanParameterFailsTheReplay) {
  const replay::GoldenCase golden =
      replay::load_golden(std::string(ENGINE_GOLDEN_DIR) + "/adamw/distadam_basic.safetensors");
  replay::Replayer r(golden, world());
  for (const auto& d : r.step(1))
    EXPECT_TRUE(replay::passes(d, golden.suggested_atol)) << d.param;
  const std::string& name = golden.params.front().name;
  core::Tensor poisoned = r.full(name).clone();
  poisoned.data<float>()[poisoned.numel() / 2] = std::numeric_limits<float>::quiet_NaN();
  r.set_full(name, poisoned);
  const replay::Difference worst = replay::worst_difference(r.step(2));
  EXPECT_EQ(worst.param, name);
  EXPECT_TRUE(std::isinf(worst.max_abs));
  EXPECT_FALSE(replay::passes(worst, golden.suggested_atol));
}

// A golden file stored in half precision replays exactly as the f32 file holding the same
// values: optim_replay reads BF16 and F16 tensors as the floats they stand for. The values are
// distadam_basic's, rounded to bf16 (8 significant bits, so its inits, all in f16's normal range,
// are exact in F16 too); the inits are stored as F16, the gradients as BF16.
TEST(GoldenFiles, Bf16AndF16FilesReplayAsTheirF32Values) {
  comm::Communicator& comm = world();
  const std::string dir =
      std::filesystem::temp_directory_path() / ("golden_half_" + std::to_string(::getppid()));
  const std::string f32_path = dir + "/f32.safetensors", half_path = dir + "/half.safetensors";
  if (comm.rank() == 0) {
    std::filesystem::create_directories(dir);
    const core::SafetensorsReader in(std::string(ENGINE_GOLDEN_DIR) +
                                     "/adamw/distadam_basic.safetensors");
    core::SafetensorsWriter f32, half;
    for (const auto& [key, value] : in.metadata()) {
      f32.set_metadata(key, value);
      half.set_metadata(key, value);
    }
    for (const core::StTensorInfo& t : in.tensors()) {
      const core::Tensor value = in.read_f32(t.name);
      if (!t.name.starts_with("init/") && !t.name.starts_with("grad/")) {
        f32.add(t.name, value);
        half.add(t.name, value);
        continue;
      }
      const core::Tensor b16 = value.to(core::DType::BF16);
      f32.add(t.name, b16.to(core::DType::F32));
      if (t.name.starts_with("grad/")) {
        half.add(t.name, b16);
        continue;
      }
      // The same values as IEEE halves: bf16's 7 mantissa bits fit in f16's 10.
      std::vector<std::byte> bytes;
      for (float v : b16.to_vector()) {
        uint32_t u = 0;
        std::memcpy(&u, &v, sizeof(u));
        const int exponent = static_cast<int>((u >> 23) & 0xFF) - 127 + 15;
        ASSERT_TRUE(exponent >= 1 && exponent <= 30 && (u & 0x1FFF) == 0) << t.name << " " << v;
        const uint16_t h =
            static_cast<uint16_t>(((u >> 16) & 0x8000) | (exponent << 10) | ((u >> 13) & 0x3FF));
        bytes.push_back(static_cast<std::byte>(h & 0xFF));
        bytes.push_back(static_cast<std::byte>(h >> 8));
      }
      half.add_bytes(t.name, core::StDType::F16, t.shape, std::move(bytes));
    }
    f32.write(f32_path);
    half.write(half_path);
  }
  comm.barrier();
  const replay::GoldenCase a = replay::load_golden(f32_path), b = replay::load_golden(half_path);
  EXPECT_EQ(b.file->info("init/embed.weight").dtype, core::StDType::F16);
  EXPECT_EQ(b.file->info("grad/1/embed.weight").dtype, core::StDType::BF16);
  replay::Replayer ra(a, comm), rb(b, comm);
  ra.run();
  rb.run();
  for (const auto& p : a.params)
    EXPECT_TRUE(bitwise_equal(rb.full(p.name), ra.full(p.name))) << p.name;
  comm.barrier();
  if (comm.rank() == 0) std::filesystem::remove_all(dir);
}

// A golden file whose param_overrides name every one of its parameters leaves the replay's
// catch-all '*' group with none; that group is optional, so the replay runs (empty groups are
// refused otherwise). distadam_basic cut to its one parameter embed.weight, overridden with
// lr_mul 1 (the same trajectory).
TEST(GoldenFiles, OverridesNamingEveryParameterReplay) {
  comm::Communicator& comm = world();
  const std::string dir =
      std::filesystem::temp_directory_path() / ("golden_overrides_" + std::to_string(::getppid()));
  const std::string path = dir + "/one_param.safetensors";
  const std::string name = "embed.weight";
  if (comm.rank() == 0) {
    std::filesystem::create_directories(dir);
    const core::SafetensorsReader in(std::string(ENGINE_GOLDEN_DIR) +
                                     "/adamw/distadam_basic.safetensors");
    core::SafetensorsWriter out;
    for (const auto& [key, value] : in.metadata())
      out.set_metadata(key, value);
    YAML::Node hyper = YAML::Load(in.metadata_value("hyperparameters"));
    hyper["param_overrides"][name]["lr_mul"] = 1.0;
    YAML::Emitter json;
    json << YAML::DoubleQuoted << YAML::Flow << hyper;
    out.set_metadata("hyperparameters", json.c_str());
    for (const core::StTensorInfo& t : in.tensors())
      if (t.name.ends_with("/" + name)) out.add(t.name, in.read_f32(t.name));
    out.write(path);
  }
  comm.barrier();
  const replay::GoldenCase golden = replay::load_golden(path);
  ASSERT_EQ(golden.params.size(), 1u);
  replay::Replayer r(golden, comm);
  const replay::Difference worst = replay::worst_difference(r.run());
  EXPECT_EQ(worst.param, name);
  EXPECT_TRUE(replay::passes(worst, golden.suggested_atol)) << worst.max_abs;
  comm.barrier();
  if (comm.rank() == 0) std::filesystem::remove_all(dir);
}
