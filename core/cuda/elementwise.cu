// The CUDA backend's elementwise family (core/ops/elementwise.h): kernel_math.h per element in
// grid-stride loops, the same functions the CPU backend runs.
#include <cuda_runtime.h>

#include <algorithm>
#include <initializer_list>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_launch.cuh"
#include "core/cuda/cuda_reduce.cuh"
#include "core/kernel_math.h"

namespace core {

using cuda_detail::block_allreduce;
using cuda_detail::chunk_of_block;
using cuda_detail::chunk_table;
using cuda_detail::ChunkedSpan;
using cuda_detail::DeviceBuffer;
using cuda_detail::first_index;
using cuda_detail::FloatPack;
using cuda_detail::grid_for;
using cuda_detail::grid_rows;
using cuda_detail::grid_stride;
using cuda_detail::kThreads;
using cuda_detail::load_pack;
using cuda_detail::pack_width;
using cuda_detail::store_pack;
using cuda_detail::Sum;

namespace {

__global__ void add_kernel(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    out[i] = a[i] + b[i];
}

__global__ void scale_kernel(float* x, float alpha, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    x[i] *= alpha;
}

// x *= alpha over the tensors of a chunk table, a block per chunk.
constexpr int64_t kScaleChunk = int64_t{1} << 14;

// alpha is *alpha_on_device where that is given (a factor the device computed), else alpha.
__global__ void scale_many_kernel(const ChunkedSpan<float>* table, int count, float alpha,
                                  const float* alpha_on_device) {
  const auto c = chunk_of_block(table, count, kScaleChunk);
  const float a = alpha_on_device ? *alpha_on_device : alpha;
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x)
    c.t.x[i] *= a;
}

__global__ void axpby_kernel(float* y, float a, const float* x, float b, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    y[i] = a * x[i] + b * y[i];
}

__device__ inline float widen(float x) {
  return x;
}
__device__ inline float widen(bf16 x) {
  return kmath::float_from_bf16(x);
}
__device__ inline void store(float* out, float x) {
  *out = x;
}
__device__ inline void store(bf16* out, float x) {
  *out = kmath::bf16_from_float(x);
}

// f32, or bf16 precision's residual stream (bf16 in and out, the f32 value rounded once).
template <typename V>
__global__ void scalar_mix_kernel(V* out, const float* wa, const V* a, const float* wb, const V* b,
                                  int64_t n) {
  const float ca = wa ? wa[0] : 1.0f, cb = b ? wb[0] : 0.0f;
  for (int64_t i = first_index(); i < n; i += grid_stride())
    store(out + i, b ? ca * widen(a[i]) + cb * widen(b[i]) : ca * widen(a[i]));
}

__global__ void scalar_mix_backward_kernel(float* da, float* db, const float* wa, const float* wb,
                                           const float* dout, int64_t n) {
  const float ca = wa ? wa[0] : 1.0f, cb = db ? wb[0] : 0.0f;
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    da[i] += ca * dout[i];
    if (db) db[i] += cb * dout[i];
  }
}

// Per-row coefficients at stride s: out[r, :] = c[r s] a[r, :] (+ out[r, :]).
template <typename V>
__global__ void row_scale_add_kernel(V* out, const float* c, int64_t s, const V* a, int64_t cols,
                                     int64_t n, bool accumulate) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float v = c[(i / cols) * s] * widen(a[i]);
    store(out + i, accumulate ? widen(out[i]) + v : v);
  }
}

__global__ void row_scale_add_da_kernel(float* da, const float* c, int64_t s, const float* dout,
                                        int64_t cols, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    da[i] += c[(i / cols) * s] * dout[i];
}

// One block per row: dc[r s] += <a[r, :], dout[r, :]> (block_allreduce's fixed order).
template <typename V>
__global__ void row_scale_add_dc_kernel(float* dc, int64_t s, const V* a, const float* dout,
                                        int64_t cols) {
  const int64_t row = blockIdx.x;
  Sum<float> sum;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
    sum.value += dout[row * cols + j] * widen(a[row * cols + j]);
  sum = block_allreduce(sum);
  if (threadIdx.x == 0) dc[row * s] += sum.value;
}

__global__ void sigmoid_forward_kernel(float* out, const float* inp, float gain, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    out[i] = gain * kmath::sigmoid(inp[i]);
}

__global__ void sigmoid_backward_kernel(float* dinp, const float* inp, const float* dout,
                                        float gain, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const float s = kmath::sigmoid(inp[i]);
    dinp[i] += gain * s * (1.0f - s) * dout[i];
  }
}

__global__ void sigmoid_scale_kernel(float* out, const float* lambda, const float* c, int64_t s,
                                     int64_t n) {
  const float g = kmath::sigmoid(lambda[0]);
  for (int64_t i = first_index(); i < n; i += grid_stride())
    out[i] = g * c[i * s];
}

// One block: d lambda over all of i (block_allreduce's fixed order), then d c.
__global__ void sigmoid_scale_backward_kernel(float* dc, float* dlambda, const float* lambda,
                                              const float* c, int64_t s, const float* dout,
                                              int64_t n) {
  const float g = kmath::sigmoid(lambda[0]);
  Sum<float> sum;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    sum.value += c[i * s] * dout[i];
    if (dc) dc[i * s] += g * dout[i];
  }
  sum = block_allreduce(sum);
  if (threadIdx.x == 0) dlambda[0] += g * (1.0f - g) * sum.value;
}

// The two weight gradients as column sums of one column ([n, 1]): dout a and dout b.
template <typename V>
struct MixDots {
  static constexpr int kCount = 2;
  const float* dout;
  const V* a;
  const V* b;
  __device__ void operator()(int64_t r, int64_t, int64_t, float* v) const {
    v[0] = a ? dout[r] * widen(a[r]) : 0.0f;
    v[1] = b ? dout[r] * widen(b[r]) : 0.0f;
  }
};

// Record #89's gated injections: out = x + c_n src (f32, or bf16 precision's stream), and the
// backward's dsrc += c_n dout.
template <typename V>
__global__ void coef_add_kernel(V* out, const V* x, const float* c, int64_t c_stride,
                                const float* src, int64_t D, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    store(out + i, widen(x[i]) + c[(i / D) * c_stride] * src[i]);
}

__global__ void coef_add_backward_kernel(float* dsrc, const float* c, int64_t c_stride,
                                         const float* dout, int64_t D, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    dsrc[i] += c[(i / D) * c_stride] * dout[i];
}

// dc[n c_stride] += <src[n, :], dout[n, :]>: a block a row, the dot reduced in a fixed order.
__global__ void coef_row_dots_kernel(float* dc, int64_t c_stride, const float* src,
                                     const float* dout, int64_t N, int64_t D) {
  for (int64_t n = blockIdx.x; n < N; n += gridDim.x) {
    cuda_detail::Sum<float> s;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
      s.value += src[n * D + d] * dout[n * D + d];
    s = cuda_detail::block_allreduce(s);
    if (threadIdx.x == 0) dc[n * c_stride] += s.value;
  }
}

// With one coefficient for every row: the sum of src dout over all N D elements, as a column sum.
struct CoefDot {
  static constexpr int kCount = 1;
  const float* src;
  const float* dout;
  __device__ void operator()(int64_t r, int64_t, int64_t, float* v) const {
    v[0] = src[r] * dout[r];
  }
};

// The activations and the bf16 conversions run once or twice per layer over [N, 4 D]: they move
// W = 4 floats a load where n and the pointers allow (activation_width).

template <int W>
struct alignas(sizeof(bf16) * W) Bf16Pack {
  bf16 v[W];
};

template <int W>
__global__ void f32_to_bf16_kernel(bf16* out, const float* in, int64_t n) {
  for (int64_t i = first_index() * W; i < n; i += grid_stride() * W) {
    const FloatPack<W> x = load_pack<W>(in + i);
    Bf16Pack<W> y;
#pragma unroll
    for (int k = 0; k < W; ++k)
      y.v[k] = kmath::bf16_from_float(x.v[k]);
    *reinterpret_cast<Bf16Pack<W>*>(out + i) = y;
  }
}

__global__ void bf16_to_f32_kernel(float* out, const bf16* in, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    out[i] = kmath::float_from_bf16(in[i]);
}

struct Gelu {
  __device__ static float forward(float u) { return kmath::gelu_tanh(u); }
  __device__ static float grad(float u) { return kmath::gelu_tanh_grad(u); }
};
struct GeluErf {
  __device__ static float forward(float u) { return kmath::gelu_erf(u); }
  __device__ static float grad(float u) { return kmath::gelu_erf_grad(u); }
};
struct Relu2 {
  __device__ static float forward(float u) { return kmath::relu2(u); }
  __device__ static float grad(float u) { return kmath::relu2_grad(u); }
};

// bf16 precision: the activation, and d inp written (=), each stored rounded to bf16.
template <typename Act>
__global__ void activation_forward_bf16_kernel(bf16* out, const float* inp, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    out[i] = kmath::bf16_from_float(Act::forward(inp[i]));
}
template <typename Act>
__global__ void activation_backward_bf16_kernel(bf16* dinp, const float* inp, const float* dout,
                                                int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    dinp[i] = kmath::bf16_from_float(Act::grad(inp[i]) * dout[i]);
}

template <typename Act, int W>
__global__ void activation_forward_kernel(float* out, const float* inp, int64_t n) {
  for (int64_t i = first_index() * W; i < n; i += grid_stride() * W) {
    FloatPack<W> x = load_pack<W>(inp + i);
#pragma unroll
    for (int k = 0; k < W; ++k)
      x.v[k] = Act::forward(x.v[k]);
    store_pack<W>(out + i, x);
  }
}

// dinp += dout * act'(inp)
template <typename Act, int W>
__global__ void activation_backward_kernel(float* dinp, const float* inp, const float* dout,
                                           int64_t n) {
  for (int64_t i = first_index() * W; i < n; i += grid_stride() * W) {
    const FloatPack<W> x = load_pack<W>(inp + i), g = load_pack<W>(dout + i);
    FloatPack<W> acc = load_pack<W>(dinp + i);
#pragma unroll
    for (int k = 0; k < W; ++k)
      acc.v[k] += g.v[k] * Act::grad(x.v[k]);
    store_pack<W>(dinp + i, acc);
  }
}

__global__ void lerp_kernel(float* a, const float* b, float w, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    a[i] = kmath::lerp(a[i], b[i], w);
}

__global__ void add_scaled_kernel(float* y, float a, const float* x, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    y[i] = kmath::add_scaled(y[i], a, x[i]);
}

}  // namespace

void CudaBackend::add(float* out, const float* a, const float* b, int64_t n) {
  if (n <= 0) return;
  add_kernel<<<grid_for(n), kThreads, 0, stream_>>>(out, a, b, n);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::scale(float* x, float alpha, int64_t n) {
  if (n <= 0) return;
  scale_kernel<<<grid_for(n), kThreads, 0, stream_>>>(x, alpha, n);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::scale_many(std::span<const std::span<float>> xs, float alpha) {
  launch_scale_many(xs, alpha, nullptr);
}

void CudaBackend::scale_many_by(std::span<const std::span<float>> xs, const float* alpha) {
  launch_scale_many(xs, 1.0f, alpha);
}

void CudaBackend::launch_scale_many(std::span<const std::span<float>> xs, float alpha,
                                    const float* alpha_on_device) {
  std::vector<ChunkedSpan<float>> table;
  const int64_t chunks = chunk_table(xs, kScaleChunk, table, name_ + ": scale_many");
  if (table.empty()) return;
  // The table travels with the stream (an asynchronous upload).
  DeviceBuffer<ChunkedSpan<float>> device_table(allocator_, static_cast<int64_t>(table.size()));
  copy_from_host(device_table.get(), table.data(), table.size() * sizeof(ChunkedSpan<float>));
  scale_many_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream_>>>(
      device_table.get(), static_cast<int>(table.size()), alpha, alpha_on_device);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::axpby(float* y, float a, const float* x, float b, int64_t n) {
  if (n <= 0) return;
  axpby_kernel<<<grid_for(n), kThreads, 0, stream_>>>(y, a, x, b, n);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::coef_add(float* out, const float* x, const float* c, int64_t c_stride,
                           const float* src, int64_t N, int64_t D) {
  cuda_detail::check_sizes(name_ + ": coef_add", {N, D, c_stride});
  if (N * D == 0) return;
  coef_add_kernel<<<grid_for(N * D), kThreads, 0, stream_>>>(out, x, c, c_stride, src, D, N * D);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::coef_add(bf16* out, const bf16* x, const float* c, int64_t c_stride,
                           const float* src, int64_t N, int64_t D) {
  cuda_detail::check_sizes(name_ + ": coef_add", {N, D, c_stride});
  if (N * D == 0) return;
  coef_add_kernel<<<grid_for(N * D), kThreads, 0, stream_>>>(out, x, c, c_stride, src, D, N * D);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::coef_add_backward(float* dsrc, float* dc, const float* c, int64_t c_stride,
                                    const float* src, const float* dout, int64_t N, int64_t D) {
  cuda_detail::check_sizes(name_ + ": coef_add_backward", {N, D, c_stride});
  if (N * D == 0) return;
  if (dc != nullptr && c_stride == 0) {
    cuda_detail::column_sums(allocator_, stream_, cuda_detail::ColumnTargets{{dc, nullptr}},
                             CoefDot{src, dout}, N * D, 1, "coef_add_backward");
  } else if (dc != nullptr) {
    coef_row_dots_kernel<<<static_cast<unsigned>(std::min<int64_t>(N, int64_t{1} << 20)), kThreads,
                           0, stream_>>>(dc, c_stride, src, dout, N, D);
    ENGINE_CUDA_LAUNCHED();
  }
  if (dsrc != nullptr) {
    coef_add_backward_kernel<<<grid_for(N * D), kThreads, 0, stream_>>>(dsrc, c, c_stride, dout, D,
                                                                        N * D);
    ENGINE_CUDA_LAUNCHED();
  }
}

void CudaBackend::scalar_mix(float* out, const float* wa, const float* a, const float* wb,
                             const float* b, int64_t n) {
  if (n <= 0) return;
  scalar_mix_kernel<<<grid_for(n), kThreads, 0, stream_>>>(out, wa, a, wb, b, n);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::scalar_mix_backward(float* da, float* db, float* dwa, float* dwb, const float* wa,
                                      const float* a, const float* wb, const float* b,
                                      const float* dout, int64_t n) {
  if (n <= 0) return;
  cuda_detail::column_sums(allocator_, stream_,
                           cuda_detail::ColumnTargets{{wa ? dwa : nullptr, b ? dwb : nullptr}},
                           MixDots<float>{dout, wa ? a : nullptr, b}, n, 1, "scalar_mix_backward");
  scalar_mix_backward_kernel<<<grid_for(n), kThreads, 0, stream_>>>(da, b ? db : nullptr, wa, wb,
                                                                    dout, n);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::scalar_mix(bf16* out, const float* wa, const bf16* a, const float* wb,
                             const bf16* b, int64_t n) {
  if (n <= 0) return;
  scalar_mix_kernel<<<grid_for(n), kThreads, 0, stream_>>>(out, wa, a, wb, b, n);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::scalar_mix_backward(float* da, float* db, float* dwa, float* dwb, const float* wa,
                                      const bf16* a, const float* wb, const bf16* b,
                                      const float* dout, int64_t n) {
  if (n <= 0) return;
  cuda_detail::column_sums(allocator_, stream_,
                           cuda_detail::ColumnTargets{{wa ? dwa : nullptr, b ? dwb : nullptr}},
                           MixDots<bf16>{dout, wa ? a : nullptr, b}, n, 1, "scalar_mix_backward");
  scalar_mix_backward_kernel<<<grid_for(n), kThreads, 0, stream_>>>(da, b ? db : nullptr, wa, wb,
                                                                    dout, n);
  ENGINE_CUDA_LAUNCHED();
}

namespace {

// Runs launch(W, blocks) with W = 4 where n and every pointer allow 16-byte float packs.
template <typename Launch>
void launch_packed(int64_t n, std::initializer_list<const void*> pointers, Launch launch) {
  if (pack_width(n, pointers) == 4) {
    launch(std::integral_constant<int, 4>{}, grid_for(n / 4));
  } else {
    launch(std::integral_constant<int, 1>{}, grid_for(n));
  }
  ENGINE_CUDA_LAUNCHED();
}

template <typename Act>
void activation_forward(float* out, const float* inp, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  launch_packed(n, {out, inp}, [&](auto w, unsigned blocks) {
    activation_forward_kernel<Act, decltype(w)::value>
        <<<blocks, kThreads, 0, stream>>>(out, inp, n);
  });
}

template <typename Act>
void activation_backward(float* dinp, const float* inp, const float* dout, int64_t n,
                         cudaStream_t stream) {
  if (n <= 0) return;
  launch_packed(n, {dinp, inp, dout}, [&](auto w, unsigned blocks) {
    activation_backward_kernel<Act, decltype(w)::value>
        <<<blocks, kThreads, 0, stream>>>(dinp, inp, dout, n);
  });
}

}  // namespace

void CudaBackend::f32_to_bf16(bf16* out, const float* in, int64_t n) {
  if (n <= 0) return;
  launch_packed(n, {out, in}, [&](auto w, unsigned blocks) {
    f32_to_bf16_kernel<decltype(w)::value><<<blocks, kThreads, 0, stream_>>>(out, in, n);
  });
}

void CudaBackend::bf16_to_f32(float* out, const bf16* in, int64_t n) {
  if (n <= 0) return;
  bf16_to_f32_kernel<<<grid_for(n), kThreads, 0, stream_>>>(out, in, n);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::gelu_forward(float* out, const float* inp, int64_t n) {
  activation_forward<Gelu>(out, inp, n, stream_);
}

void CudaBackend::gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  activation_backward<Gelu>(dinp, inp, dout, n, stream_);
}

namespace {

void check_row_scale(const std::string& op, int64_t c_stride, int64_t rows, int64_t cols) {
  ENGINE_CHECK(c_stride >= 1 && rows >= 0 && cols >= 0,
               op + ": the coefficient stride must be >= 1 (got " + std::to_string(c_stride) +
                   "), the sizes >= 0");
}

template <typename V>
void row_scale_add_launch(V* out, const float* c, int64_t c_stride, const V* a, int64_t rows,
                          int64_t cols, bool accumulate, cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n <= 0) return;
  row_scale_add_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, c, c_stride, a, cols, n,
                                                             accumulate);
  ENGINE_CUDA_LAUNCHED();
}

template <typename V>
void row_scale_add_backward_launch(float* da, float* dc, const float* c, int64_t c_stride,
                                   const V* a, const float* dout, int64_t rows, int64_t cols,
                                   cudaStream_t stream) {
  const int64_t n = rows * cols;
  if (n <= 0) return;
  if (dc) {
    row_scale_add_dc_kernel<<<grid_rows(rows, "row_scale_add_backward"), kThreads, 0, stream>>>(
        dc, c_stride, a, dout, cols);
    ENGINE_CUDA_LAUNCHED();
  }
  if (da) {
    row_scale_add_da_kernel<<<grid_for(n), kThreads, 0, stream>>>(da, c, c_stride, dout, cols, n);
    ENGINE_CUDA_LAUNCHED();
  }
}

}  // namespace

void CudaBackend::row_scale_add(float* out, const float* c, int64_t c_stride, const float* a,
                                int64_t rows, int64_t cols, bool accumulate) {
  check_row_scale(name_ + ": row_scale_add", c_stride, rows, cols);
  row_scale_add_launch(out, c, c_stride, a, rows, cols, accumulate, stream_);
}

void CudaBackend::row_scale_add(bf16* out, const float* c, int64_t c_stride, const bf16* a,
                                int64_t rows, int64_t cols, bool accumulate) {
  check_row_scale(name_ + ": row_scale_add", c_stride, rows, cols);
  row_scale_add_launch(out, c, c_stride, a, rows, cols, accumulate, stream_);
}

void CudaBackend::row_scale_add_backward(float* da, float* dc, const float* c, int64_t c_stride,
                                         const float* a, const float* dout, int64_t rows,
                                         int64_t cols) {
  check_row_scale(name_ + ": row_scale_add_backward", c_stride, rows, cols);
  row_scale_add_backward_launch(da, dc, c, c_stride, a, dout, rows, cols, stream_);
}

void CudaBackend::row_scale_add_backward(float* da, float* dc, const float* c, int64_t c_stride,
                                         const bf16* a, const float* dout, int64_t rows,
                                         int64_t cols) {
  check_row_scale(name_ + ": row_scale_add_backward", c_stride, rows, cols);
  row_scale_add_backward_launch(da, dc, c, c_stride, a, dout, rows, cols, stream_);
}

void CudaBackend::sigmoid_forward(float* out, const float* inp, float gain, int64_t n) {
  if (n <= 0) return;
  sigmoid_forward_kernel<<<grid_for(n), kThreads, 0, stream_>>>(out, inp, gain, n);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::sigmoid_backward(float* dinp, const float* inp, const float* dout, float gain,
                                   int64_t n) {
  if (n <= 0) return;
  sigmoid_backward_kernel<<<grid_for(n), kThreads, 0, stream_>>>(dinp, inp, dout, gain, n);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::sigmoid_scale(float* out, const float* lambda, const float* c, int64_t c_stride,
                                int64_t n) {
  check_row_scale(name_ + ": sigmoid_scale", c_stride, n, 1);
  if (n <= 0) return;
  sigmoid_scale_kernel<<<grid_for(n), kThreads, 0, stream_>>>(out, lambda, c, c_stride, n);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::sigmoid_scale_backward(float* dc, float* dlambda, const float* lambda,
                                         const float* c, int64_t c_stride, const float* dout,
                                         int64_t n) {
  check_row_scale(name_ + ": sigmoid_scale_backward", c_stride, n, 1);
  if (n <= 0) return;
  sigmoid_scale_backward_kernel<<<1, kThreads, 0, stream_>>>(dc, dlambda, lambda, c, c_stride, dout,
                                                             n);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::gelu_erf_forward(float* out, const float* inp, int64_t n) {
  activation_forward<GeluErf>(out, inp, n, stream_);
}

void CudaBackend::gelu_erf_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  activation_backward<GeluErf>(dinp, inp, dout, n, stream_);
}

void CudaBackend::relu2_forward(float* out, const float* inp, int64_t n) {
  activation_forward<Relu2>(out, inp, n, stream_);
}

void CudaBackend::relu2_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  activation_backward<Relu2>(dinp, inp, dout, n, stream_);
}

void CudaBackend::gelu_forward(bf16* out, const float* inp, int64_t n) {
  if (n <= 0) return;
  activation_forward_bf16_kernel<Gelu><<<grid_for(n), kThreads, 0, stream_>>>(out, inp, n);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::gelu_backward(bf16* dinp, const float* inp, const float* dout, int64_t n) {
  if (n <= 0) return;
  activation_backward_bf16_kernel<Gelu><<<grid_for(n), kThreads, 0, stream_>>>(dinp, inp, dout, n);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::relu2_forward(bf16* out, const float* inp, int64_t n) {
  if (n <= 0) return;
  activation_forward_bf16_kernel<Relu2><<<grid_for(n), kThreads, 0, stream_>>>(out, inp, n);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::relu2_backward(bf16* dinp, const float* inp, const float* dout, int64_t n) {
  if (n <= 0) return;
  activation_backward_bf16_kernel<Relu2><<<grid_for(n), kThreads, 0, stream_>>>(dinp, inp, dout, n);
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

}  // namespace core
