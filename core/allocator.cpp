#include "core/allocator.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace core {

void Allocator::count_alloc(size_t bytes) {
  size_t live = live_bytes_ += bytes;
  size_t peak = peak_bytes_.load();
  while (live > peak && !peak_bytes_.compare_exchange_weak(peak, live)) {
  }
}

void* CpuAllocator::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  void* ptr = std::aligned_alloc(kAlignment, rounded);
  if (ptr == nullptr) throw std::bad_alloc();
  count_alloc(bytes);
  return ptr;
}

void CpuAllocator::deallocate(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  std::free(ptr);
  count_free(bytes);
}

void CpuAllocator::copy_within(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

CpuAllocator& cpu_allocator() {
  static CpuAllocator allocator;
  return allocator;
}

}  // namespace core
