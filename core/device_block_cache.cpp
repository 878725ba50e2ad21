#include "core/device_block_cache.h"

namespace core {

size_t DeviceBlockCache::bucket_size(size_t bytes) {
  constexpr size_t kSmallStep = 512;
  constexpr size_t kLargeStep = size_t{1} << 20;
  const size_t step = bytes <= kLargeStep ? kSmallStep : kLargeStep;
  return (bytes + step - 1) / step * step;
}

void* DeviceBlockCache::take(Stream stream, size_t bucket) {
  auto it = free_.find({stream, bucket});
  if (it == free_.end() || it->second.empty()) return nullptr;
  void* ptr = it->second.back();
  it->second.pop_back();
  cached_bytes_ -= bucket;
  return ptr;
}

void DeviceBlockCache::put(Stream stream, size_t bucket, void* ptr) {
  free_[{stream, bucket}].push_back(ptr);
  cached_bytes_ += bucket;
}

std::vector<std::pair<void*, size_t>> DeviceBlockCache::drain() {
  std::vector<std::pair<void*, size_t>> blocks;
  for (auto& [key, ptrs] : free_)
    for (void* ptr : ptrs)
      blocks.emplace_back(ptr, key.second);
  free_.clear();
  cached_bytes_ = 0;
  return blocks;
}

void DeviceBlockCache::count_driver_alloc(size_t bucket) {
  reserved_bytes_ += bucket;
  if (reserved_bytes_ > peak_reserved_bytes_) peak_reserved_bytes_ = reserved_bytes_;
  ++driver_allocs_;
}

void DeviceBlockCache::count_driver_free(size_t bucket) {
  reserved_bytes_ -= bucket;
}

}  // namespace core
