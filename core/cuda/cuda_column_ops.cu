// The CUDA backend's block copies, column permutations and signs, float updates (lerp, add_scaled)
// and in-order sums. The per-element and per-column math is kernel_math.h's, the same functions
// the CPU backend runs; the sums of squares use a fixed reduction tree (deterministic, equal to
// the CPU's index order up to float64 rounding). nvcc contracts a * b + c into fused
// multiply-adds, so elementwise results may differ from the CPU's in the last float bit.
#include <cuda_runtime.h>

#include <string>

#include "core/check.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_launch.cuh"
#include "core/kernel_math.h"

namespace core {

using cuda_detail::block_allreduce;
using cuda_detail::first_index;
using cuda_detail::grid_for;
using cuda_detail::grid_stride;
using cuda_detail::kThreads;
using cuda_detail::Sum;

namespace {

constexpr int kReduceThreads = 1024;  // one block reduces a whole tensor

__global__ void set_identity_kernel(float* q, int64_t n) {
  for (int64_t k = first_index(); k < n * n; k += grid_stride())
    q[k] = k / n == k % n ? 1.0f : 0.0f;
}

__global__ void lerp_kernel(float* a, const float* b, float w, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    a[i] = kmath::lerp(a[i], b[i], w);
}

__global__ void add_scaled_kernel(float* y, float a, const float* x, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    y[i] = kmath::add_scaled(y[i], a, x[i]);
}

// One thread per column, walking down the rows in order (neighbouring threads read neighbouring
// columns).
__global__ void column_dots_kernel(float* out, const float* a, const float* b, int64_t rows,
                                   int64_t cols) {
  for (int64_t j = first_index(); j < cols; j += grid_stride())
    out[j] = kmath::column_dot(a, b, rows, cols, j);
}

// Every element finds its place in the stable descending order by counting (O(n^2), n is a
// factor's size).
__global__ void argsort_descending_kernel(int32_t* order, const float* x, int64_t n) {
  for (int64_t j = first_index(); j < n; j += grid_stride())
    order[kmath::descending_rank(x, n, j)] = static_cast<int32_t>(j);
}

__global__ void gather_columns_kernel(float* out, const float* src, const int32_t* index,
                                      int64_t rows, int64_t cols, int* status) {
  for (int64_t k = first_index(); k < rows * cols; k += grid_stride()) {
    const int64_t i = k / cols, j = k % cols;
    const int32_t from = index[j];
    if (from < 0 || from >= cols) {
      cuda_detail::raise_status(status, cuda_detail::kStatusColumnIndexOutOfRange, j);
      out[k] = 0.0f;
      continue;
    }
    out[k] = src[i * cols + from];
  }
}

__global__ void reverse_columns_kernel(float* out, const float* src, int64_t rows, int64_t cols) {
  for (int64_t k = first_index(); k < rows * cols; k += grid_stride()) {
    const int64_t i = k / cols, j = k % cols;
    out[k] = src[i * cols + (cols - 1 - j)];
  }
}

// One thread per column: it finds the column's sign and negates it.
__global__ void canonicalize_column_signs_kernel(float* q, int64_t rows, int64_t cols) {
  for (int64_t j = first_index(); j < cols; j += grid_stride())
    if (kmath::column_sign_flips(q, rows, cols, j))
      for (int64_t i = 0; i < rows; ++i)
        q[i * cols + j] = -q[i * cols + j];
}

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

}  // namespace

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

void CudaBackend::lerp(float* a, const float* b, float w, int64_t n) {
  if (n <= 0) return;
  lerp_kernel<<<grid_for(n), kThreads, 0, stream_>>>(a, b, w, n);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::add_scaled(float* y, float a, const float* x, int64_t n) {
  if (n <= 0) return;
  add_scaled_kernel<<<grid_for(n), kThreads, 0, stream_>>>(y, a, x, n);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::column_dots(float* out, const float* a, const float* b, int64_t rows,
                              int64_t cols) {
  if (cols <= 0) return;
  column_dots_kernel<<<grid_for(cols), kThreads, 0, stream_>>>(out, a, b, rows, cols);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::argsort_descending(int32_t* order, const float* x, int64_t n) {
  ENGINE_CHECK(n >= 0 && n <= INT32_MAX, name_ + ": argsort_descending: " + std::to_string(n) +
                                             " elements exceed int32 indices");
  if (n == 0) return;
  argsort_descending_kernel<<<grid_for(n), kThreads, 0, stream_>>>(order, x, n);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::gather_columns(float* out, const float* src, const int32_t* index, int64_t rows,
                                 int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  gather_columns_kernel<<<grid_for(rows * cols), kThreads, 0, stream_>>>(out, src, index, rows,
                                                                         cols, status_);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::reverse_columns(float* out, const float* src, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  reverse_columns_kernel<<<grid_for(rows * cols), kThreads, 0, stream_>>>(out, src, rows, cols);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::canonicalize_column_signs(float* q, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  canonicalize_column_signs_kernel<<<grid_for(cols), kThreads, 0, stream_>>>(q, rows, cols);
  ENGINE_CUDA_LAUNCHED();
}

double CudaBackend::sum_squares_in_order(const float* x, int64_t n) {
  if (n <= 0) return 0.0;
  sum_squares_block_kernel<<<1, kReduceThreads, 0, stream_>>>(reduce_scratch_, x, n);
  ENGINE_CUDA_LAUNCHED();
  double result = 0.0;
  copy_to_host(&result, reduce_scratch_, sizeof(double));
  return result;
}

}  // namespace core
