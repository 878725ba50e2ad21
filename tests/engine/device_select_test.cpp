// Device selection for every combination of mode, build and GPUs (engine/device_select.h).
#include "engine/device_select.h"

#include <gtest/gtest.h>

#include <string>

namespace {

using engine::DeviceFacts;
using engine::select_device;

DeviceFacts facts(bool cuda_built, int gpus, int local_rank = 0, int local_size = 1) {
  return DeviceFacts{cuda_built, gpus, local_rank, local_size};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(DeviceSelect, CpuIsAlwaysTheCpu) {
  for (const DeviceFacts& f :
       {facts(false, 0), facts(true, 0), facts(true, 8, 3, 8), facts(true, 1, 1, 4)}) {
    const auto s = select_device("cpu", f);
    ASSERT_TRUE(s.ok()) << s.error;
    EXPECT_EQ(s.device, core::Device::cpu());
  }
}

TEST(DeviceSelect, AutoFallsBackToTheCpuWithoutCudaOrGpu) {
  for (const DeviceFacts& f : {facts(false, 0), facts(false, 4), facts(true, 0, 0, 4)}) {
    const auto s = select_device("auto", f);
    ASSERT_TRUE(s.ok()) << s.error;
    EXPECT_EQ(s.device, core::Device::cpu());
  }
}

TEST(DeviceSelect, EachRankTakesTheGpuOfItsLocalRank) {
  for (const char* mode : {"auto", "cuda"}) {
    for (int r = 0; r < 8; ++r) {
      const auto s = select_device(mode, facts(true, 8, r, 8));
      ASSERT_TRUE(s.ok()) << mode << " " << s.error;
      EXPECT_EQ(s.device, core::Device::cuda(r)) << mode;
    }
    // Fewer ranks than GPUs: the first local ranks' GPUs.
    const auto s = select_device(mode, facts(true, 8, 1, 2));
    ASSERT_TRUE(s.ok()) << s.error;
    EXPECT_EQ(s.device, core::Device::cuda(1));
  }
}

TEST(DeviceSelect, CudaWithoutTheCudaBuildSaysSo) {
  for (int gpus : {0, 2}) {
    const auto s = select_device("cuda", facts(false, gpus));
    ASSERT_FALSE(s.ok());
    EXPECT_TRUE(contains(s.error, "this build has no CUDA backend")) << s.error;
    EXPECT_FALSE(contains(s.error, "no GPU")) << s.error;
  }
}

TEST(DeviceSelect, CudaWithoutAGpuSaysSo) {
  const auto s = select_device("cuda", facts(true, 0));
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(contains(s.error, "this machine shows no GPU")) << s.error;
  EXPECT_FALSE(contains(s.error, "build")) << s.error;
}

TEST(DeviceSelect, MoreLocalRanksThanGpusIsRefusedNamingBothCounts) {
  for (const char* mode : {"auto", "cuda"}) {
    const auto s = select_device(mode, facts(true, 2, 0, 3));
    ASSERT_FALSE(s.ok()) << mode;
    EXPECT_TRUE(contains(s.error, "runs 3 ranks but shows 2 GPU(s)")) << s.error;
    EXPECT_TRUE(contains(s.error, std::string("device: ") + mode)) << s.error;
  }
}

TEST(DeviceSelect, UnknownModesAreRefused) {
  EXPECT_TRUE(engine::is_device_mode("auto"));
  EXPECT_TRUE(engine::is_device_mode("cpu"));
  EXPECT_TRUE(engine::is_device_mode("cuda"));
  for (const char* mode : {"gpu", "CUDA", "", "cuda:0"}) {
    EXPECT_FALSE(engine::is_device_mode(mode)) << mode;
    const auto s = select_device(mode, facts(true, 1));
    ASSERT_FALSE(s.ok()) << mode;
    EXPECT_TRUE(contains(s.error, "use auto, cpu or cuda")) << s.error;
  }
}

}  // namespace

TEST(DeviceSelect, SharedGpusTakeTheLocalRankModuloTheGpus) {
  DeviceFacts f = facts(true, 2, 3, 4);
  f.share_gpus = true;
  for (const char* mode : {"auto", "cuda"}) {
    const auto s = select_device(mode, f);
    ASSERT_TRUE(s.ok()) << s.error;
    EXPECT_EQ(s.device, core::Device::cuda(1)) << mode;
  }
  f.share_gpus = false;
  const auto refused = select_device("cuda", f);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(contains(refused.error, "comm.device_collectives: mpi")) << refused.error;
}
