// The CUDA backend's reductions family (core/ops/reductions.h): float64 sums of squares in fixed
// orders (deterministic, equal to the CPU's index order up to float64 rounding) and column dot
// products.
#include <cuda_runtime.h>

#include <span>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_launch.cuh"
#include "core/kernel_math.h"

namespace core {

using cuda_detail::block_allreduce;
using cuda_detail::chunk_of_block;
using cuda_detail::chunk_table;
using cuda_detail::ChunkedSpan;
using cuda_detail::DeviceBuffer;
using cuda_detail::first_index;
using cuda_detail::grid_for;
using cuda_detail::grid_stride;
using cuda_detail::kThreads;
using cuda_detail::Sum;

namespace {

// Sums of squares of a list of tensors in three launches, whatever its length: block b sums
// chunk b of all the tensors' chunks (kSquareChunk elements, float64), one block per tensor then
// adds its chunks' partials, and one thread adds the tensors' sums in list order. Every sum's
// order is fixed by the sizes alone, and sum_squares is the list of one, so sum_squares_many
// equals the host loop over sum_squares bit for bit. (One launch pair per tensor took 1.5 ms a
// step for GPT-2 124M's 148 gradients on an H200.)
constexpr int64_t kSquareChunk = int64_t{1} << 14;

using Chunked = ChunkedSpan<const float>;

__global__ void chunk_squares_kernel(double* partial, const Chunked* table, int count) {
  const auto c = chunk_of_block(table, count, kSquareChunk);
  Sum<double> s;
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
    const double v = c.t.x[i];
    s.value += v * v;
  }
  s = block_allreduce(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s.value;
}

// sums[k] = the partials of tensor k's chunks, one block each.
__global__ void tensor_sums_kernel(double* sums, const double* partial, const Chunked* table,
                                   int count, int64_t chunks) {
  const int k = blockIdx.x;
  const int64_t end = k + 1 < count ? table[k + 1].first_chunk : chunks;
  Sum<double> s;
  for (int64_t i = table[k].first_chunk + threadIdx.x; i < end; i += blockDim.x)
    s.value += partial[i];
  s = block_allreduce(s);
  if (threadIdx.x == 0) sums[k] = s.value;
}

// *out = 0 + x[0] + x[1] + ... in this order (one thread: the order is the host loop's).
__global__ void sum_in_order_kernel(double* out, const double* x, int64_t count) {
  double total = 0;
  for (int64_t i = 0; i < count; ++i)
    total += x[i];
  *out = total;
}

// One thread: the step's gradient scale from its sum of squares (kmath::grad_clip_scale).
__global__ void grad_clip_scale_kernel(float* scale, const double* sum_squares, double mean,
                                       double max_norm) {
  *scale = kmath::grad_clip_scale(*sum_squares, mean, max_norm);
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
  const std::span<const float> one(x, static_cast<size_t>(n));
  return sum_squares_many({&one, 1});
}

double CudaBackend::sum_squares_many(std::span<const std::span<const float>> xs) {
  sum_squares_many(xs, reduce_scratch_);
  double result = 0.0;
  copy_to_host(&result, reduce_scratch_, sizeof(double));
  return result;
}

void CudaBackend::sum_squares_many(std::span<const std::span<const float>> xs, double* out) {
  std::vector<Chunked> table;
  const int64_t chunks = chunk_table(xs, kSquareChunk, table, name_ + ": sum_squares_many");
  if (table.empty()) {  // empty tensors add 0
    fill_zero(out, sizeof(double));
    return;
  }
  const int count = static_cast<int>(table.size());
  // The table travels with the stream (an asynchronous upload).
  DeviceBuffer<Chunked> device_table(allocator_, count);
  copy_from_host(device_table.get(), table.data(), table.size() * sizeof(Chunked));
  DeviceBuffer<double> partial(allocator_, chunks);
  DeviceBuffer<double> sums(allocator_, count);
  chunk_squares_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream_>>>(
      partial.get(), device_table.get(), count);
  ENGINE_CUDA_LAUNCHED();
  tensor_sums_kernel<<<static_cast<unsigned>(count), kReduceThreads, 0, stream_>>>(
      sums.get(), partial.get(), device_table.get(), count, chunks);
  ENGINE_CUDA_LAUNCHED();
  sum_in_order_kernel<<<1, 1, 0, stream_>>>(out, sums.get(), count);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::grad_clip_scale(float* scale, const double* sum_squares, double mean,
                                  double max_norm) {
  grad_clip_scale_kernel<<<1, 1, 0, stream_>>>(scale, sum_squares, mean, max_norm);
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

void CudaBackend::column_dots(float* out, const float* a, const float* b, int64_t rows,
                              int64_t cols) {
  if (cols <= 0) return;
  column_dots_kernel<<<grid_for(cols), kThreads, 0, stream_>>>(out, a, b, rows, cols);
  ENGINE_CUDA_LAUNCHED();
}

namespace {

// The largest bit pattern of |x| (non-negative floats order as their bits; a NaN's exceed
// infinity's): each block's max over its grid-stride elements, then one atomicMax on the bits
// of *out (zeroed first). A max is exact in any order, so the atomics leave it deterministic.
struct MaxBits {
  uint32_t value = 0;
  __device__ void merge(const MaxBits& o) { value = o.value > value ? o.value : value; }
};

__device__ uint32_t abs_bits(float v) {
  return kmath::float_bits(v) & 0x7FFFFFFFu;
}
__device__ uint32_t abs_bits(bf16 v) {
  return (static_cast<uint32_t>(v.bits) << 16) & 0x7FFFFFFFu;
}

template <typename T>
__global__ void abs_max_kernel(float* out, const T* x, int64_t n) {
  MaxBits m;
  for (int64_t i = first_index(); i < n; i += grid_stride())
    m.merge({abs_bits(x[i])});
  m = block_allreduce(m);
  if (threadIdx.x == 0 && m.value != 0) atomicMax(reinterpret_cast<unsigned int*>(out), m.value);
}

template <typename T>
void launch_abs_max(float* out, const T* x, int64_t n, cudaStream_t stream) {
  ENGINE_CUDA_CALL(cudaMemsetAsync(out, 0, sizeof(float), stream));
  if (n <= 0) return;
  abs_max_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, x, n);
  ENGINE_CUDA_LAUNCHED();
}

}  // namespace

void CudaBackend::abs_max(float* out, const float* x, int64_t n) {
  launch_abs_max(out, x, n, stream_);
}

void CudaBackend::abs_max(float* out, const bf16* x, int64_t n) {
  launch_abs_max(out, x, n, stream_);
}

}  // namespace core
