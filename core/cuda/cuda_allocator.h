// Device memory for one GPU: cudaMalloc/cudaFree behind a size-bucketed cache, so the
// per-step allocate/free pattern of activations and workspaces does not hit cudaMalloc (which
// synchronises the device) after the first step.
//
// A freed block is handed out again without waiting for the device. That is safe for work on the
// owning backend's stream (the legacy default stream) and on blocking streams, which it is
// implicitly ordered against (e.g. NCCL's); work on a non-blocking stream that uses a block must
// be waited for before the block is freed.
#pragma once

#include <cstddef>
#include <map>
#include <mutex>
#include <vector>

#include "core/allocator.h"

namespace core {

class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int device_index);
  ~CudaAllocator() override;
  CudaAllocator(const CudaAllocator&) = delete;
  CudaAllocator& operator=(const CudaAllocator&) = delete;

  Device device() const override { return Device::cuda(device_index_); }
  // live_bytes()/peak_bytes() count the bytes asked for; cached_bytes() what the cache holds
  // back from the driver in freed blocks.
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  // cudaMemcpy on the legacy default stream: after the backend's kernels, synchronous.
  void copy_within(void* dst, const void* src, size_t bytes) override;

  size_t cached_bytes() const;
  // Returns every cached block to the driver (also done once before reporting out-of-memory).
  void release_cached();

  // The bucket a request falls in: 512-byte steps up to 1 MiB, then 1 MiB steps, so a freed
  // block is reused by any request of the same bucket.
  static size_t bucket_size(size_t bytes);

 private:
  void release_cached_locked();

  int device_index_;
  mutable std::mutex mutex_;
  std::map<size_t, std::vector<void*>> free_blocks_;  // bucket size -> freed blocks
  size_t cached_bytes_ = 0;
};

}  // namespace core
