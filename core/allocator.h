// Per-device memory allocators. Every Tensor's storage comes from one; each counts the bytes it
// has live so tests can check that nothing (e.g. a stage-3 gathered parameter) outlives its use.
#pragma once

#include <atomic>
#include <cstddef>

#include "core/device.h"

namespace core {

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* ptr, size_t bytes) = 0;
  // Copies `bytes` between two non-overlapping blocks of this allocator's memory, ordered after
  // the work already issued on them (Tensor::clone of a device tensor: optimizer state snapshots).
  virtual void copy_within(void* dst, const void* src, size_t bytes) = 0;

  size_t live_bytes() const { return live_bytes_.load(); }
  size_t peak_bytes() const { return peak_bytes_.load(); }
  void reset_peak() { peak_bytes_.store(live_bytes_.load()); }

 protected:
  void count_alloc(size_t bytes);
  void count_free(size_t bytes) { live_bytes_ -= bytes; }

 private:
  std::atomic<size_t> live_bytes_{0};
  std::atomic<size_t> peak_bytes_{0};
};

// Host memory, 64-byte aligned (a cache line; the widest AVX-512 load).
class CpuAllocator final : public Allocator {
 public:
  static constexpr size_t kAlignment = 64;
  Device device() const override { return Device::cpu(); }
  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  void copy_within(void* dst, const void* src, size_t bytes) override;
};

// The process-wide host allocator.
CpuAllocator& cpu_allocator();

}  // namespace core
