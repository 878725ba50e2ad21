// core::make_backend: the host gets the process-wide CPU backend, a GPU a backend of its own or
// an error naming why there is none.
#include "core/backend_factory.h"

#include <gtest/gtest.h>

#include "core/check.h"

namespace {

TEST(BackendFactory, TheHostGetsTheCpuBackend) {
  std::shared_ptr<core::Backend> a = core::make_backend(core::Device::cpu());
  std::shared_ptr<core::Backend> b = core::make_backend(core::Device::cpu());
  EXPECT_EQ(a.get(), &core::cpu_backend());
  EXPECT_EQ(b.get(), a.get());
  a.reset();  // the CPU backend outlives every pointer to it
  EXPECT_EQ(core::cpu_backend().device(), core::Device::cpu());
}

TEST(BackendFactory, AGpuGetsItsOwnBackendOrTheReasonItHasNone) {
  if (core::cuda_device_count() > 0) {
    std::shared_ptr<core::Backend> gpu = core::make_backend(core::Device::cuda(0));
    EXPECT_EQ(gpu->device(), core::Device::cuda(0));
  } else {
    EXPECT_THROW(core::make_backend(core::Device::cuda(0)), core::Error);
  }
}

}  // namespace
