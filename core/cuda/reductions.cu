// The CUDA backend's reductions family (core/ops/reductions.h): float64 sums of squares in fixed
// orders (deterministic, equal to the CPU's index order up to float64 rounding) and column dot
// products.
#include <cuda_runtime.h>

#include <algorithm>
#include <span>
#include <string>

#include "core/check.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_launch.cuh"
#include "core/kernel_math.h"

namespace core {

using cuda_detail::block_allreduce;
using cuda_detail::DeviceBuffer;
using cuda_detail::first_index;
using cuda_detail::grid_for;
using cuda_detail::grid_stride;
using cuda_detail::kThreads;
using cuda_detail::Sum;

namespace {

// Per-block float64 partial sums of x^2; a second single-block pass adds the partials in order,
// so the result does not depend on block scheduling.
__global__ void sum_squares_partial_kernel(double* partial, const float* x, int64_t n) {
  Sum<double> s;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    double v = x[i];
    s.value += v * v;
  }
  s = block_allreduce(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s.value;
}

__global__ void sum_partials_kernel(double* out, const double* partial, int64_t count) {
  Sum<double> s;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x)
    s.value += partial[i];
  s = block_allreduce(s);
  if (threadIdx.x == 0) *out = s.value;
}

// *out = 0 + x[0] + x[1] + ... in this order (one thread: the order is the host loop's).
__global__ void sum_in_order_kernel(double* out, const double* x, int64_t count) {
  double total = 0;
  for (int64_t i = 0; i < count; ++i)
    total += x[i];
  *out = total;
}

constexpr int kReduceThreads = 1024;  // one block reduces a whole tensor

// out[0] = sum of x^2 in float64, one block of kReduceThreads.
__global__ void sum_squares_block_kernel(double* out, const float* x, int64_t n) {
  Sum<double> s;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double xi = x[i];
    s.value += xi * xi;
  }
  s = block_allreduce(s);
  if (threadIdx.x == 0) out[0] = s.value;
}

// One thread per column, walking down the rows in order (neighbouring threads read neighbouring
// columns).
__global__ void column_dots_kernel(float* out, const float* a, const float* b, int64_t rows,
                                   int64_t cols) {
  for (int64_t j = first_index(); j < cols; j += grid_stride())
    out[j] = kmath::column_dot(a, b, rows, cols, j);
}

}  // namespace

double CudaBackend::sum_squares(const float* x, int64_t n) {
  if (n <= 0) return 0.0;
  const unsigned blocks = grid_for(n);
  DeviceBuffer<double> partial(allocator_, blocks);
  sum_squares_partial_kernel<<<blocks, kThreads, 0, stream_>>>(partial.get(), x, n);
  ENGINE_CUDA_LAUNCHED();
  sum_partials_kernel<<<1, 1024, 0, stream_>>>(reduce_scratch_, partial.get(), blocks);
  ENGINE_CUDA_LAUNCHED();
  double result = 0.0;
  copy_to_host(&result, reduce_scratch_, sizeof(double));
  return result;
}

double CudaBackend::sum_squares_many(std::span<const std::span<const float>> xs) {
  if (xs.empty()) return 0.0;
  unsigned max_blocks = 1;
  for (std::span<const float> x : xs)
    max_blocks = std::max(max_blocks, grid_for(static_cast<int64_t>(x.size())));
  // Each tensor's sum exactly as sum_squares() forms it, kept on the device; the partials buffer
  // is reused in stream order.
  DeviceBuffer<double> partial(allocator_, max_blocks);
  DeviceBuffer<double> sums(allocator_, static_cast<int64_t>(xs.size()));
  fill_zero(sums.get(), xs.size() * sizeof(double));
  for (size_t i = 0; i < xs.size(); ++i) {
    const int64_t n = static_cast<int64_t>(xs[i].size());
    if (n == 0) continue;
    const unsigned blocks = grid_for(n);
    sum_squares_partial_kernel<<<blocks, kThreads, 0, stream_>>>(partial.get(), xs[i].data(), n);
    ENGINE_CUDA_LAUNCHED();
    sum_partials_kernel<<<1, 1024, 0, stream_>>>(sums.get() + i, partial.get(), blocks);
    ENGINE_CUDA_LAUNCHED();
  }
  sum_in_order_kernel<<<1, 1, 0, stream_>>>(reduce_scratch_, sums.get(),
                                            static_cast<int64_t>(xs.size()));
  ENGINE_CUDA_LAUNCHED();
  double result = 0.0;
  copy_to_host(&result, reduce_scratch_, sizeof(double));
  return result;
}

double CudaBackend::sum_squares_in_order(const float* x, int64_t n) {
  if (n <= 0) return 0.0;
  sum_squares_block_kernel<<<1, kReduceThreads, 0, stream_>>>(reduce_scratch_, x, n);
  ENGINE_CUDA_LAUNCHED();
  double result = 0.0;
  copy_to_host(&result, reduce_scratch_, sizeof(double));
  return result;
}

void CudaBackend::column_dots(float* out, const float* a, const float* b, int64_t rows,
                              int64_t cols) {
  if (cols <= 0) return;
  column_dots_kernel<<<grid_for(cols), kThreads, 0, stream_>>>(out, a, b, rows, cols);
  ENGINE_CUDA_LAUNCHED();
}

}  // namespace core
