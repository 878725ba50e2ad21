// Device memory for one GPU: cudaMalloc/cudaFree behind a cache of freed blocks
// (core/device_block_cache.h), so the allocate/free pattern of a training step does not reach
// the driver (cudaMalloc and cudaFree synchronise the device) once the first step has run.
//
// The allocator serves one stream, the owning backend's compute stream (set_stream): a freed
// block comes back for a request on that stream without waiting, as the stream orders the new
// work after the old. Work on another stream that uses a block must be ordered against the
// compute stream by whoever issues it (the NCCL communicator does: comm/nccl_communicator.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>

#include "core/allocator.h"
#include "core/device_block_cache.h"

struct CUstream_st;

namespace core {

class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int device_index);
  ~CudaAllocator() override;
  CudaAllocator(const CudaAllocator&) = delete;
  CudaAllocator& operator=(const CudaAllocator&) = delete;

  // The stream blocks are allocated for and copies run on; set once by the backend, before the
  // first allocation.
  void set_stream(CUstream_st* stream) { stream_ = stream; }

  Device device() const override { return Device::cuda(device_index_); }
  // live_bytes()/peak_bytes() count the bytes asked for; reserved_bytes() what is held from the
  // driver (live blocks rounded to their size class, plus the cache).
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  // In the stream's order after the work already issued there.
  void copy_within(void* dst, const void* src, size_t bytes) override;

  size_t cached_bytes() const;
  size_t reserved_bytes() const;
  size_t peak_reserved_bytes() const;
  void reset_peak_reserved();
  // cudaMalloc calls so far.
  int64_t driver_allocs() const;
  // Returns every cached block to the driver (also done once before reporting out-of-memory).
  void release_cached();

  static size_t bucket_size(size_t bytes) { return DeviceBlockCache::bucket_size(bytes); }

 private:
  void release_cached_locked();

  int device_index_;
  CUstream_st* stream_ = nullptr;
  mutable std::mutex mutex_;
  DeviceBlockCache cache_;
};

}  // namespace core
