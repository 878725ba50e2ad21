// The CPU backend's linalg family (core/ops/linalg.h). QR, eigh and SVD through LAPACKE
// (cpu_linalg.h), single, batched and as lists, and the column permutations and signs of their
// results (kernel_math.h per column).
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>

#include "core/check.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_linalg.h"
#include "core/kernel_math.h"

namespace core {

void CpuBackend::qr(float* q, float* r, const float* a, int64_t m, int64_t n, int64_t batch) {
  cpu::qr(q, r, a, m, n, batch);
}

void CpuBackend::eigh(float* w, float* v, const float* a, int64_t n, int64_t batch) {
  cpu::eigh(w, v, a, n, batch);
}

void CpuBackend::svd(float* u, float* s, float* vt, const float* a, int64_t m, int64_t n,
                     int64_t batch) {
  cpu::svd(u, s, vt, a, m, n, batch);
}

void CpuBackend::eigh_many(std::span<const EighTask> tasks) {
  cpu::eigh_many(tasks);
}

void CpuBackend::qr_many(std::span<const QrTask> tasks) {
  cpu::qr_many(tasks);
}

void CpuBackend::gram_many(std::span<const GramTask> tasks) {
  cpu::gram_many(tasks);
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

}  // namespace core
