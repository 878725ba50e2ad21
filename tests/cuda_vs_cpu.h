// The CudaVsCpu fixture: a CUDA backend beside the CPU one (skipped without a device), device
// buffers freed together, and the relative comparison of their results.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/check.h"

namespace core::test {

// Largest |got - want| / max(1, |want|).
inline double max_rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0.0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    double d = std::abs(static_cast<double>(got[i]) - want[i]) /
               std::max(1.0, std::abs(static_cast<double>(want[i])));
    if (!(d <= worst)) worst = d;  // NaN sticks
  }
  return worst;
}

#define EXPECT_CLOSE(got, want, tol) \
  EXPECT_LE(::core::test::max_rel_error((got), (want)), (tol)) << "comparing " #got " with " #want

// Device buffers of one backend, freed together.
class DeviceScratch {
 public:
  explicit DeviceScratch(Backend& backend) : backend_(backend) {}
  ~DeviceScratch() {
    try {
      backend_.synchronize();
    } catch (const Error& e) {
      ADD_FAILURE() << "unreported device error: " << e.what();
    }
    for (auto [ptr, bytes] : blocks_)
      backend_.allocator().deallocate(ptr, bytes);
  }
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;

  template <typename T>
  T* upload(const std::vector<T>& host) {
    T* ptr = alloc<T>(host.size());
    backend_.copy_from_host(ptr, host.data(), host.size() * sizeof(T));
    return ptr;
  }
  template <typename T>
  T* alloc(size_t count) {
    size_t bytes = std::max<size_t>(count, 1) * sizeof(T);
    void* ptr = backend_.allocator().allocate(bytes);
    blocks_.emplace_back(ptr, bytes);
    return static_cast<T*>(ptr);
  }
  template <typename T>
  std::vector<T> download(const T* ptr, size_t count) {
    std::vector<T> host(count);
    backend_.copy_to_host(host.data(), ptr, count * sizeof(T));
    return host;
  }

 private:
  Backend& backend_;
  std::vector<std::pair<void*, size_t>> blocks_;
};

// Device copies `offset` floats past the allocator's (16-byte aligned) blocks: at offset 1 the
// memory-bound kernels must take their one-float path instead of 16-byte packs.
class ShiftedScratch {
 public:
  ShiftedScratch(DeviceScratch& dev, int offset) : dev_(dev), offset_(offset) {}
  float* upload(const std::vector<float>& host) {
    std::vector<float> padded(static_cast<size_t>(offset_), 0.0f);
    padded.insert(padded.end(), host.begin(), host.end());
    return dev_.upload(padded) + offset_;
  }
  float* alloc(int64_t n) { return dev_.alloc<float>(static_cast<size_t>(n + offset_)) + offset_; }

 private:
  DeviceScratch& dev_;
  int offset_;
};

class CudaVsCpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
    gpu_ = make_cuda_backend(0);
    dev_ = std::make_unique<DeviceScratch>(*gpu_);
  }
  void TearDown() override {
    dev_.reset();
    gpu_.reset();
  }
  Backend& cpu() { return cpu_backend(); }
  Backend& gpu() { return *gpu_; }
  DeviceScratch& dev() { return *dev_; }

  std::unique_ptr<Backend> gpu_;
  std::unique_ptr<DeviceScratch> dev_;
};

}  // namespace core::test
