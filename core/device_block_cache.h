// The bookkeeping of the caching device allocator (core/cuda/cuda_allocator.h), apart from the
// driver calls so that a host test checks it (tests/core/device_block_cache_test.cpp).
//
// A freed block is cached under the stream it was allocated on and its size class, and comes back
// only for a request of the same class on the same stream: work on that stream is ordered after
// everything that used the block before, so no event or host wait is needed. Another stream that
// touches a block must be ordered against the allocating one by its owner (the NCCL
// communicator waits for the compute stream before each collective, and makes the compute
// stream wait for it when its Work is waited for).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace core {

class DeviceBlockCache {
 public:
  using Stream = const void*;  // an opaque stream handle (cudaStream_t)

  // The size class of a request: 512-byte steps up to 1 MiB, then 1 MiB steps.
  static size_t bucket_size(size_t bytes);

  // A cached block of size class `bucket` freed on `stream`, or nullptr when there is none.
  void* take(Stream stream, size_t bucket);
  // Caches a freed block.
  void put(Stream stream, size_t bucket, void* ptr);
  // Every cached block with its size class, removed from the cache (for the driver to free).
  std::vector<std::pair<void*, size_t>> drain();

  // The driver's side: a block of `bucket` bytes obtained from or returned to the driver.
  void count_driver_alloc(size_t bucket);
  void count_driver_free(size_t bucket);

  size_t cached_bytes() const { return cached_bytes_; }
  // Bytes held from the driver (in use or cached) and their peak since reset_peak_reserved().
  size_t reserved_bytes() const { return reserved_bytes_; }
  size_t peak_reserved_bytes() const { return peak_reserved_bytes_; }
  void reset_peak_reserved() { peak_reserved_bytes_ = reserved_bytes_; }
  // Driver allocations so far: constant across steps once the cache is warm.
  int64_t driver_allocs() const { return driver_allocs_; }

 private:
  std::map<std::pair<Stream, size_t>, std::vector<void*>> free_;
  size_t cached_bytes_ = 0;
  size_t reserved_bytes_ = 0;
  size_t peak_reserved_bytes_ = 0;
  int64_t driver_allocs_ = 0;
};

}  // namespace core
