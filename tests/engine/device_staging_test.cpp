// Checkpoints through host buffers (engine/checkpoint/sharded_state.h, core/transfer.h): tensors
// of a device are copied with the backend's copy_to_host / copy_from_host, never read in place. A
// stand-in device (host memory that reports cuda:0) shows that every device tensor takes that
// path and that the checkpoint files refuse anything else; the CUDA resume test does it on a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <vector>

#include "comm/sharding_plan.h"
#include "core/backend.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "engine/checkpoint/sharded_state.h"
#include "tests/test_util.h"

using test_util::error_of;

namespace {

namespace fs = std::filesystem;

// Host memory labelled cuda:0: tensors from it are "device" tensors to every check.
class StandInDeviceAllocator final : public core::Allocator {
 public:
  core::Device device() const override { return core::Device::cuda(0); }
  void* allocate(size_t bytes) override {
    count_alloc(bytes);
    return std::malloc(bytes == 0 ? 1 : bytes);
  }
  void deallocate(void* ptr, size_t bytes) override {
    count_free(bytes);
    std::free(ptr);
  }
  void copy_within(void* dst, const void* src, size_t bytes) override {
    ++copies;
    std::memcpy(dst, src, bytes);
  }
  int copies = 0;
};

std::vector<float> iota_values(size_t n, float start) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// A stand-in device tensor holding `values`, written through the backend as a GPU tensor is.
core::Tensor device_tensor(StandInDeviceAllocator& alloc, const core::Shape& shape,
                           const std::vector<float>& values) {
  core::Tensor t = core::Tensor::empty(shape, core::DType::F32, alloc);
  core::cpu_backend().copy_from_host(t.raw_data(), values.data(), values.size() * sizeof(float));
  return t;
}

std::vector<float> device_values(const core::Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  core::cpu_backend().copy_to_host(v.data(), t.raw_data(), t.nbytes());
  return v;
}

class DeviceStaging : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = (fs::temp_directory_path() /
             ("engine_staging_test_" +
              std::string(::testing::UnitTest::GetInstance()->current_test_info()->name())))
                .string();
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  StandInDeviceAllocator device_;
  std::string root_;
};

TEST_F(DeviceStaging, SlicesOnADeviceAreCopiedToTheHostHostSlicesAreNot) {
  core::Tensor on_device = device_tensor(device_, {2, 3}, iota_values(6, 1));
  core::Tensor on_host = core::Tensor::from_vector({4}, iota_values(4, 10));
  engine::RankState state;
  state.slices = {{"param/a", {2, 3}, 0, 0, on_device}, {"param/b", {4}, 0, 0, on_host}};
  engine::stage_to_host(state, core::cpu_backend());
  const core::Tensor& a = state.slices[0].local;
  EXPECT_TRUE(a.device().is_cpu());
  EXPECT_NE(a.storage(), on_device.storage());
  EXPECT_EQ(a.shape(), on_device.shape());
  EXPECT_EQ(a.to_vector(), iota_values(6, 1));
  EXPECT_EQ(state.slices[1].local.storage(), on_host.storage());  // no copy on the host
}

TEST_F(DeviceStaging, CheckpointFilesRefuseDeviceTensors) {
  core::Tensor on_device = device_tensor(device_, {2, 3}, iota_values(6, 1));
  engine::prepare_staging(root_, 1);
  const std::string err = error_of([&] {
    engine::write_rank_file(engine::staging_path(root_, 1), 0,
                            {{"param/a", {2, 3}, 0, 0, on_device}});
  });
  EXPECT_NE(err.find("param/a is on cuda:0: stage device tensors to host first"), std::string::npos)
      << err;
}

// Write a [5, 3] parameter on one "rank", read it back into the local part of rank 1 of 2
// living on the device: through a host buffer, and refused when read in place.
TEST_F(DeviceStaging, LocalPartsOnADeviceAreFilledThroughTheBackend) {
  const std::vector<float> full = iota_values(15, 0);
  engine::prepare_staging(root_, 4);
  engine::write_rank_file(engine::staging_path(root_, 4), 0,
                          {{"param/a", {5, 3}, 0, 0, core::Tensor::from_vector({5, 3}, full)}});
  engine::Manifest m;
  m.step = 4;
  m.world_size = 1;
  const std::string dir = engine::commit_checkpoint(root_, m, 1);
  engine::CheckpointReader reader(dir);

  const comm::ShardingPlan plan({{"a", {5, 3}, comm::Placement::shard(0), 0}}, 2, 1, 1);
  const comm::ShardingPlan::LocalSlice s = plan.local_slice(0);
  ASSERT_EQ(s.dim, 0);
  core::Tensor local = device_tensor(
      device_, plan.local_shape(0),
      std::vector<float>(static_cast<size_t>(core::shape_numel(plan.local_shape(0))), -1.0f));
  const std::string in_place = error_of([&] { reader.read("param/a", 0, s.range.begin, local); });
  EXPECT_NE(in_place.find("the output is on cuda:0"), std::string::npos) << in_place;

  const std::vector<core::Tensor> locals = {local};
  engine::read_local_params(reader, plan, locals, core::cpu_backend());
  EXPECT_EQ(device_values(local),
            std::vector<float>(full.begin() + s.range.begin * 3, full.begin() + s.range.end * 3));
}

}  // namespace

// Optimizer state snapshots (save_state) clone device tensors: the copy stays on the device,
// made by its allocator, and is independent of the original afterwards. A copy between devices
// is refused by name.
TEST_F(DeviceStaging, CloneOfADeviceTensorStaysOnTheDevice) {
  core::Tensor state = device_tensor(device_, {2, 3}, iota_values(6, 1));
  const core::Tensor snapshot = state.clone();
  EXPECT_EQ(device_.copies, 1);
  EXPECT_EQ(&snapshot.storage()->allocator(), &device_);
  EXPECT_NE(snapshot.storage(), state.storage());
  core::cpu_backend().fill_zero(state.raw_data(), state.nbytes());
  EXPECT_EQ(device_values(snapshot), iota_values(6, 1));

  core::Tensor host = core::Tensor::from_vector({2, 3}, iota_values(6, 0));
  const std::string err = error_of([&] { host.copy_from(state); });
  EXPECT_NE(err.find("copies between devices"), std::string::npos) << err;
}
