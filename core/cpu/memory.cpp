// The CPU backend's memory family (core/ops/memory.h). Host/device copies (plain memcpy on the
// host), fills, block copies and the identity.
#include <algorithm>
#include <cstring>
#include <string>

#include "core/check.h"
#include "core/cpu/cpu_backend.h"

namespace core {

void CpuBackend::copy_to_host(void* host_dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(host_dst, src, bytes);
}

void CpuBackend::copy_from_host(void* dst, const void* host_src, size_t bytes) {
  if (bytes) std::memcpy(dst, host_src, bytes);
}

void CpuBackend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes && dst != src) std::memmove(dst, src, bytes);
}

void CpuBackend::fill_zero(void* dst, size_t bytes) {
  if (bytes) std::memset(dst, 0, bytes);
}

void CpuBackend::copy_block_2d(float* dst, int64_t dst_ld, const float* src, int64_t src_ld,
                               int64_t rows, int64_t cols) {
  ENGINE_CHECK(rows >= 0 && cols >= 0 && dst_ld >= cols && src_ld >= cols,
               "copy_block_2d: a [" + std::to_string(rows) + ", " + std::to_string(cols) +
                   "] block with row strides " + std::to_string(dst_ld) + " (dst) and " +
                   std::to_string(src_ld) + " (src)");
  if (cols == 0) return;
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(dst + i * dst_ld, src + i * src_ld, static_cast<size_t>(cols) * sizeof(float));
}

void CpuBackend::set_identity(float* q, int64_t n) {
  std::fill_n(q, n * n, 0.0f);
  for (int64_t i = 0; i < n; ++i)
    q[i * n + i] = 1.0f;
}

}  // namespace core
