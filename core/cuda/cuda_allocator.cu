#include "core/cuda/cuda_allocator.h"

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
  for (auto& [size, blocks] : free_blocks_) {
    for (void* ptr : blocks)
      cudaFree(ptr);
  }
  cudaSetDevice(previous);
}

size_t CudaAllocator::bucket_size(size_t bytes) {
  constexpr size_t kSmallStep = 512;
  constexpr size_t kLargeStep = size_t{1} << 20;
  size_t step = bytes <= kLargeStep ? kSmallStep : kLargeStep;
  return (bytes + step - 1) / step * step;
}

void* CudaAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  size_t size = bucket_size(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = free_blocks_.find(size);
  if (it != free_blocks_.end() && !it->second.empty()) {
    // Safe without waiting: the backend's work runs on the legacy default stream, ordered after
    // any earlier work on it or on a blocking stream that used the block (see the header).
    void* ptr = it->second.back();
    it->second.pop_back();
    cached_bytes_ -= size;
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
                std::to_string(live_bytes()) + " bytes, peak " + std::to_string(peak_bytes()));
  }
  count_alloc(bytes);
  return ptr;
}

void CudaAllocator::deallocate(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  size_t size = bucket_size(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  free_blocks_[size].push_back(ptr);
  cached_bytes_ += size;
  count_free(bytes);
}

void CudaAllocator::copy_within(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  DeviceGuard guard(device_index_);
  ENGINE_CUDA_CALL(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}

size_t CudaAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cached_bytes_;
}

void CudaAllocator::release_cached() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_cached_locked();
}

void CudaAllocator::release_cached_locked() {
  DeviceGuard guard(device_index_);
  for (auto& [size, blocks] : free_blocks_) {
    for (void* ptr : blocks)
      ENGINE_CUDA_CALL(cudaFree(ptr));
  }
  free_blocks_.clear();
  cached_bytes_ = 0;
}

}  // namespace core
