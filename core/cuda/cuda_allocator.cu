#include "core/cuda/cuda_allocator.h"

#include <cuda_runtime.h>

#include <string>

#include "core/check.h"
#include "core/cuda/cuda_check.h"

namespace core {

namespace {

// Selects the allocator's device for the duration of one driver call and restores the caller's.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device_index) {
    ENGINE_CUDA_CALL(cudaGetDevice(&previous_));
    if (previous_ != device_index) ENGINE_CUDA_CALL(cudaSetDevice(device_index));
    switched_ = previous_ != device_index;
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

}  // namespace

CudaAllocator::CudaAllocator(int device_index) : device_index_(device_index) {}

CudaAllocator::~CudaAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  // A destructor must not throw; a failing cudaFree at teardown has nothing left to protect.
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) return;
  cudaSetDevice(device_index_);
  for (auto [ptr, size] : cache_.drain())
    cudaFree(ptr);
  cudaSetDevice(previous);
}

void* CudaAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  const size_t size = bucket_size(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  if (void* ptr = cache_.take(stream_, size)) {
    count_alloc(bytes);
    return ptr;
  }
  DeviceGuard guard(device_index_);
  void* ptr = nullptr;
  cudaError_t status = cudaMalloc(&ptr, size);
  if (status == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // out-of-memory is not sticky: reset the last error and retry
    release_cached_locked();
    status = cudaMalloc(&ptr, size);
  }
  if (status != cudaSuccess) {
    cudaGetLastError();
    ENGINE_FAIL("cuda:" + std::to_string(device_index_) + ": cudaMalloc of " +
                std::to_string(size) + " bytes failed (" + cudaGetErrorString(status) + "); live " +
                std::to_string(live_bytes()) + " bytes, peak " + std::to_string(peak_bytes()) +
                ", held from the driver " + std::to_string(cache_.reserved_bytes()));
  }
  cache_.count_driver_alloc(size);
  count_alloc(bytes);
  return ptr;
}

void CudaAllocator::deallocate(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  cache_.put(stream_, bucket_size(bytes), ptr);
  count_free(bytes);
}

void CudaAllocator::copy_within(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  DeviceGuard guard(device_index_);
  ENGINE_CUDA_CALL(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

size_t CudaAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cache_.cached_bytes();
}

size_t CudaAllocator::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cache_.reserved_bytes();
}

size_t CudaAllocator::peak_reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cache_.peak_reserved_bytes();
}

void CudaAllocator::reset_peak_reserved() {
  std::lock_guard<std::mutex> lock(mutex_);
  cache_.reset_peak_reserved();
}

int64_t CudaAllocator::driver_allocs() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cache_.driver_allocs();
}

void CudaAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cached_locked();
}

void CudaAllocator::release_cached_locked() {
  DeviceGuard guard(device_index_);
  // cudaFree waits for the device, so blocks still used by queued work are not pulled from it.
  for (auto [ptr, size] : cache_.drain()) {
    ENGINE_CUDA_CALL(cudaFree(ptr));
    cache_.count_driver_free(size);
  }
}

}  // namespace core
