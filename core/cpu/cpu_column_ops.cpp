// The CPU backend's block copies, column permutations and signs, float updates (lerp, add_scaled)
// and in-order sums: the per-element and per-column math of core/kernel_math.h in plain loops.
// Sums of squares and column dot products run in index order, so the results are the bits of the
// host loops the matrix optimizers' golden files were first replayed with.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/check.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_kernels.h"

namespace core {

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

void CpuBackend::lerp(float* a, const float* b, float w, int64_t n) {
  cpu::elementwise<float>(n, [=](int64_t i) { a[i] = kmath::lerp(a[i], b[i], w); });
}

void CpuBackend::add_scaled(float* y, float a, const float* x, int64_t n) {
  cpu::elementwise<float>(n, [=](int64_t i) { y[i] = kmath::add_scaled(y[i], a, x[i]); });
}

void CpuBackend::column_dots(float* out, const float* a, const float* b, int64_t rows,
                             int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > cpu::kParallelMin)
  for (int64_t j = 0; j < cols; ++j)
    out[j] = kmath::column_dot(a, b, rows, cols, j);
}

void CpuBackend::argsort_descending(int32_t* order, const float* x, int64_t n) {
  ENGINE_CHECK(n >= 0 && n <= INT32_MAX,
               "argsort_descending: " + std::to_string(n) + " elements exceed int32 indices");
  std::iota(order, order + n, 0);
  std::stable_sort(order, order + n, [x](int32_t a, int32_t b) {
    return kmath::sorts_before_descending(x[a], x[b]);
  });
}

void CpuBackend::gather_columns(float* out, const float* src, const int32_t* index, int64_t rows,
                                int64_t cols) {
  for (int64_t j = 0; j < cols; ++j)
    ENGINE_CHECK(index[j] >= 0 && index[j] < cols,
                 "gather_columns: index[" + std::to_string(j) + "] = " + std::to_string(index[j]) +
                     " is outside [0, " + std::to_string(cols) + ")");
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      out[i * cols + j] = src[i * cols + index[j]];
}

void CpuBackend::reverse_columns(float* out, const float* src, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j)
      out[i * cols + j] = src[i * cols + (cols - 1 - j)];
}

void CpuBackend::canonicalize_column_signs(float* q, int64_t rows, int64_t cols) {
  for (int64_t j = 0; j < cols; ++j)
    if (kmath::column_sign_flips(q, rows, cols, j))
      for (int64_t i = 0; i < rows; ++i)
        q[i * cols + j] = -q[i * cols + j];
}

double CpuBackend::sum_squares_in_order(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i)
    s += static_cast<double>(x[i]) * x[i];
  return s;
}

}  // namespace core
