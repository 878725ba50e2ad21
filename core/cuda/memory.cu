// The CUDA backend's memory family (core/ops/memory.h): copies between host and device and on the
// device, fills, block copies and the identity, all in stream order.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "core/check.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_launch.cuh"

namespace core {

using cuda_detail::DeviceBuffer;
using cuda_detail::first_index;
using cuda_detail::grid_for;
using cuda_detail::grid_stride;
using cuda_detail::kThreads;

namespace {

__global__ void set_identity_kernel(float* q, int64_t n) {
  for (int64_t k = first_index(); k < n * n; k += grid_stride())
    q[k] = k / n == k % n ? 1.0f : 0.0f;
}

}  // namespace

void CudaBackend::copy_to_host(void* host_dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  ENGINE_CUDA_CALL(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  ENGINE_CUDA_CALL(cudaStreamSynchronize(stream_));
  check_status();
}

void CudaBackend::copy_from_host(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  if (bytes > kMaxStagedUpload) {  // weights and checkpoints: once per run, not worth pinning
    ENGINE_CUDA_CALL(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
    // The caller may free or reuse its host buffer as soon as this returns.
    ENGINE_CUDA_CALL(cudaStreamSynchronize(stream_));
    return;
  }
  // Through a pinned slot, so the copy is asynchronous and the host runs ahead of the device
  // (a training step's token uploads). A slot is reused once its last copy is done, which after
  // kUploadSlots - 1 later uploads normally is long ago.
  UploadSlot& slot = upload_[next_upload_];
  next_upload_ = (next_upload_ + 1) % kUploadSlots;
  ENGINE_CUDA_CALL(cudaEventSynchronize(slot.copied));
  if (slot.capacity < bytes) {
    if (slot.host != nullptr) ENGINE_CUDA_CALL(cudaFreeHost(slot.host));
    slot.host = nullptr;
    slot.capacity = 0;
    const size_t capacity = std::max(bytes, size_t{1} << 20);
    ENGINE_CUDA_CALL(cudaMallocHost(&slot.host, capacity));
    slot.capacity = capacity;
  }
  std::memcpy(slot.host, host_src, bytes);
  ENGINE_CUDA_CALL(cudaMemcpyAsync(dst, slot.host, bytes, cudaMemcpyHostToDevice, stream_));
  ENGINE_CUDA_CALL(cudaEventRecord(slot.copied, stream_));
}

void CudaBackend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  const auto* d = static_cast<const char*>(dst);
  const auto* s = static_cast<const char*>(src);
  if (d < s + bytes && s < d + bytes) {
    // cudaMemcpy is undefined for overlapping ranges; the CPU's memmove is not. Go through a
    // scratch buffer so both backends give the same result.
    DeviceBuffer<char> scratch(allocator_, static_cast<int64_t>(bytes));
    ENGINE_CUDA_CALL(cudaMemcpyAsync(scratch.get(), src, bytes, cudaMemcpyDeviceToDevice, stream_));
    ENGINE_CUDA_CALL(cudaMemcpyAsync(dst, scratch.get(), bytes, cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  ENGINE_CUDA_CALL(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::fill_zero(void* dst, size_t bytes) {
  if (bytes == 0) return;
  ENGINE_CUDA_CALL(cudaMemsetAsync(dst, 0, bytes, stream_));
}

void CudaBackend::copy_block_2d(float* dst, int64_t dst_ld, const float* src, int64_t src_ld,
                                int64_t rows, int64_t cols) {
  ENGINE_CHECK(rows >= 0 && cols >= 0 && dst_ld >= cols && src_ld >= cols,
               name_ + ": copy_block_2d: a [" + std::to_string(rows) + ", " + std::to_string(cols) +
                   "] block with row strides " + std::to_string(dst_ld) + " (dst) and " +
                   std::to_string(src_ld) + " (src)");
  if (rows == 0 || cols == 0) return;
  ENGINE_CUDA_CALL(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_ld) * sizeof(float), src,
                                     static_cast<size_t>(src_ld) * sizeof(float),
                                     static_cast<size_t>(cols) * sizeof(float),
                                     static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::set_identity(float* q, int64_t n) {
  if (n <= 0) return;
  set_identity_kernel<<<grid_for(n * n), kThreads, 0, stream_>>>(q, n);
  ENGINE_CUDA_LAUNCHED();
}

}  // namespace core
