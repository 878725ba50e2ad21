// The caching device allocator's bookkeeping (core/device_block_cache.h) on the host, with fake
// block addresses: what comes back for which stream and size, what the driver is asked for.
#include "core/device_block_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace core {
namespace {

void* block(uintptr_t id) {
  return reinterpret_cast<void*>(id * 4096);
}

const int kCompute = 0, kComm = 0;
DeviceBlockCache::Stream stream_a = &kCompute;
DeviceBlockCache::Stream stream_b = &kComm;

TEST(DeviceBlockCache, BucketsRoundUpToTheirStep) {
  EXPECT_EQ(DeviceBlockCache::bucket_size(1), 512u);
  EXPECT_EQ(DeviceBlockCache::bucket_size(512), 512u);
  EXPECT_EQ(DeviceBlockCache::bucket_size(513), 1024u);
  EXPECT_EQ(DeviceBlockCache::bucket_size(size_t{1} << 20), size_t{1} << 20);
  EXPECT_EQ(DeviceBlockCache::bucket_size((size_t{1} << 20) + 1), size_t{2} << 20);
}

// A freed block comes back for its stream and size class only, last freed first.
TEST(DeviceBlockCache, ReusesABlockOnItsStreamAndSizeOnly) {
  DeviceBlockCache cache;
  EXPECT_EQ(cache.take(stream_a, 1024), nullptr);
  cache.put(stream_a, 1024, block(1));
  cache.put(stream_a, 1024, block(2));
  cache.put(stream_b, 1024, block(3));
  cache.put(stream_a, 2048, block(4));
  EXPECT_EQ(cache.cached_bytes(), 3 * 1024u + 2048u);
  EXPECT_EQ(cache.take(stream_a, 1536), nullptr);  // no block of that class
  EXPECT_EQ(cache.take(stream_a, 1024), block(2));
  EXPECT_EQ(cache.take(stream_a, 1024), block(1));
  EXPECT_EQ(cache.take(stream_a, 1024), nullptr);  // stream b's block stays with stream b
  EXPECT_EQ(cache.take(stream_b, 1024), block(3));
  EXPECT_EQ(cache.take(stream_b, 2048), nullptr);
  EXPECT_EQ(cache.cached_bytes(), 2048u);
}

// A step's pattern of allocations and frees, repeated: after the first step every request is
// served from the cache, so the driver count and the bytes held stay where the first step left
// them.
TEST(DeviceBlockCache, ASteadyPatternStopsReachingTheDriver) {
  DeviceBlockCache cache;
  uintptr_t next_id = 1;
  const std::vector<size_t> step = {100, 3000, 5u << 20, 100, 700, 5u << 20, 64};
  std::vector<int64_t> allocs_after;
  for (int s = 0; s < 4; ++s) {
    std::vector<std::pair<void*, size_t>> live;
    for (size_t bytes : step) {
      const size_t bucket = DeviceBlockCache::bucket_size(bytes);
      void* ptr = cache.take(stream_a, bucket);
      if (ptr == nullptr) {
        ptr = block(next_id++);
        cache.count_driver_alloc(bucket);
      }
      live.emplace_back(ptr, bucket);
      if (live.size() % 3 == 0) {  // some freed inside the step, the others at its end
        cache.put(stream_a, live.front().second, live.front().first);
        live.erase(live.begin());
      }
    }
    for (auto [ptr, bucket] : live)
      cache.put(stream_a, bucket, ptr);
    allocs_after.push_back(cache.driver_allocs());
  }
  EXPECT_GT(allocs_after[0], 0);
  EXPECT_EQ(allocs_after[1], allocs_after[0]);
  EXPECT_EQ(allocs_after[3], allocs_after[0]);
  EXPECT_EQ(cache.reserved_bytes(), cache.cached_bytes());  // everything freed at the end
  EXPECT_EQ(cache.peak_reserved_bytes(), cache.reserved_bytes());
}

// drain() hands every cached block to the driver with its size class; the counts follow.
TEST(DeviceBlockCache, DrainReturnsEveryCachedBlock) {
  DeviceBlockCache cache;
  for (uintptr_t id = 1; id <= 3; ++id)
    cache.count_driver_alloc(512 * id);
  cache.put(stream_a, 512, block(1));
  cache.put(stream_b, 1536, block(3));
  EXPECT_EQ(cache.reserved_bytes(), 512u + 1024u + 1536u);
  std::vector<std::pair<void*, size_t>> drained = cache.drain();
  std::sort(drained.begin(), drained.end());
  ASSERT_EQ(drained.size(), 2u);
  EXPECT_EQ(drained[0], std::make_pair(block(1), size_t{512}));
  EXPECT_EQ(drained[1], std::make_pair(block(3), size_t{1536}));
  EXPECT_EQ(cache.cached_bytes(), 0u);
  for (auto [ptr, bucket] : drained)
    cache.count_driver_free(bucket);
  EXPECT_EQ(cache.reserved_bytes(), 1024u);  // the block still in use
  EXPECT_EQ(cache.peak_reserved_bytes(), 3072u);
  cache.reset_peak_reserved();
  EXPECT_EQ(cache.peak_reserved_bytes(), 1024u);
  EXPECT_EQ(cache.take(stream_a, 512), nullptr);
}

}  // namespace
}  // namespace core
