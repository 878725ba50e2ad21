// The CPU backend's reductions family (core/ops/reductions.h). Float64 sums of squares and column
// dot products. The in-order forms run in index order, so their results are the bits of a host
// loop.
#include <span>

#include "core/cpu/cpu_backend.h"
#include "core/cpu/parallel_loops.h"
#include "core/cpu/reduction_kernels.h"
#include "core/kernel_math.h"

namespace core {

double CpuBackend::sum_squares(const float* x, int64_t n) {
  return cpu::sum_squares(x, n);
}

double CpuBackend::sum_squares_many(std::span<const std::span<const float>> xs) {
  double total = 0;
  for (std::span<const float> x : xs)
    total += cpu::sum_squares(x.data(), static_cast<int64_t>(x.size()));
  return total;
}

void CpuBackend::sum_squares_many(std::span<const std::span<const float>> xs, double* out) {
  *out = sum_squares_many(xs);
}

void CpuBackend::grad_clip_scale(float* scale, const double* sum_squares, double mean,
                                 double max_norm) {
  *scale = kmath::grad_clip_scale(*sum_squares, mean, max_norm);
}

double CpuBackend::sum_squares_in_order(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i)
    s += static_cast<double>(x[i]) * x[i];
  return s;
}

void CpuBackend::column_dots(float* out, const float* a, const float* b, int64_t rows,
                             int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > cpu::kParallelMin)
  for (int64_t j = 0; j < cols; ++j)
    out[j] = kmath::column_dot(a, b, rows, cols, j);
}

namespace {

// max |x| as the largest bit pattern of |x| (non-negative floats order as their bits; a NaN's
// bits exceed infinity's), over the rows in parallel blocks: exact in any order.
template <typename T, typename Abs>
void abs_max_bits(float* out, const T* x, int64_t n, Abs abs_bits) {
  uint32_t m = 0;
#pragma omp parallel for reduction(max : m) schedule(static) if (n > cpu::kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = abs_bits(x[i]);
    m = b > m ? b : m;
  }
  *out = kmath::float_from_bits(m);
}

}  // namespace

void CpuBackend::abs_max(float* out, const float* x, int64_t n) {
  abs_max_bits(out, x, n, [](float v) { return kmath::float_bits(v) & 0x7FFFFFFFu; });
}

void CpuBackend::abs_max(float* out, const bf16* x, int64_t n) {
  abs_max_bits(out, x, n,
               [](bf16 v) { return (static_cast<uint32_t>(v.bits) << 16) & 0x7FFFFFFFu; });
}

}  // namespace core
