// Op family: Memory: copies within the backend's device memory, and between it and the host.
// A part of the Backend interface (core/backend.h: the conventions for pointers, shapes and
// accumulation); implemented per device in core/cpu/memory.cpp and core/cuda/memory.cu.
#pragma once

#include <cstddef>
#include <cstdint>

namespace core {

class MemoryOps {
 public:
  virtual ~MemoryOps() = default;

  virtual void copy_to_host(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void copy_from_host(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;  // device to device
  virtual void fill_zero(void* dst, size_t bytes) = 0;
  // dst [rows, cols] (row stride dst_ld) <- src [rows, cols] (row stride src_ld): a block of a
  // matrix, or a matrix into a block (a stack of matrices, a gathered part). dst and src must not
  // overlap.
  virtual void copy_block_2d(float* dst, int64_t dst_ld, const float* src, int64_t src_ld,
                             int64_t rows, int64_t cols) = 0;
  // q [n, n] <- the identity.
  virtual void set_identity(float* q, int64_t n) = 0;
};

}  // namespace core
