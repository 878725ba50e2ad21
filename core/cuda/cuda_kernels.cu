// The fused ops of the CUDA backend. Elementwise and row math comes from kernel_math.h, the same
// functions the CPU backend runs (and its float64 finite-difference tests cover).
//
// Layout conventions as in backend.h: row-major, one block per row for row-wise ops, grid-stride
// loops for elementwise ops. Column sums (bias and LayerNorm parameter gradients) use a fixed
// reduction order, so they are deterministic; so are the embedding and row scatter backward,
// which sort their rows by destination instead of using atomics (see scatter_rows_in_order).
#include <cuda_runtime.h>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <climits>
#include <cmath>
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
using cuda_detail::grid_rows;
using cuda_detail::grid_stride;
using cuda_detail::kThreads;
using cuda_detail::Sum;
using cuda_detail::Sum2;

namespace {

// ---- elementwise -------------------------------------------------------------------------------

__global__ void add_kernel(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    out[i] = a[i] + b[i];
}

__global__ void scale_kernel(float* x, float alpha, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    x[i] *= alpha;
}

__global__ void axpby_kernel(float* y, float a, const float* x, float b, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    y[i] = a * x[i] + b * y[i];
}

__global__ void gelu_forward_kernel(float* out, const float* inp, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    out[i] = kmath::gelu_tanh(inp[i]);
}

__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    dinp[i] += dout[i] * kmath::gelu_tanh_grad(inp[i]);
  }
}

__global__ void relu2_forward_kernel(float* out, const float* inp, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    out[i] = kmath::relu2(inp[i]);
}

__global__ void relu2_backward_kernel(float* dinp, const float* inp, const float* dout, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    dinp[i] += dout[i] * kmath::relu2_grad(inp[i]);
  }
}

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

__global__ void add_bias_kernel(float* out, const float* bias, int64_t N, int64_t C) {
  for (int64_t i = first_index(); i < N * C; i += grid_stride())
    out[i] += bias[i % C];
}

// Column sums of K per-element quantities over the rows of [N, C], in two passes with a fixed
// order (deterministic, unlike atomics):
// 1. grid (column tiles, row chunks), block kColTile x kRowLanes: each thread sums every
//    kRowLanes-th row of its column within the chunk, the lanes are added in order, and the block
//    writes partial[(k * chunks + chunk) * C + col];
// 2. one thread per column adds the chunk partials in order into dst[k].
constexpr int kColTile = 32;
constexpr int kRowLanes = 16;
constexpr int64_t kRowsPerChunkMin = 512;
constexpr int64_t kMaxChunks = 64;

// Values of bias_backward: dout itself.
struct BiasGrad {
  static constexpr int kCount = 1;
  const float* dout;
  __device__ void operator()(int64_t r, int64_t c, int64_t C, float* v) const {
    v[0] = dout[r * C + c];
  }
};

// Values of the LayerNorm parameter gradients: dout * xhat (weight) and dout (bias).
struct LayerNormParamGrad {
  static constexpr int kCount = 2;
  const float* dout;
  const float* inp;
  const float* mean;
  const float* rstd;
  __device__ void operator()(int64_t r, int64_t c, int64_t C, float* v) const {
    const float g = dout[r * C + c];
    v[0] = g * (inp[r * C + c] - mean[r]) * rstd[r];
    v[1] = g;
  }
};

template <typename Fn>
__global__ void column_partials_kernel(float* partial, Fn fn, int64_t N, int64_t C,
                                       int64_t rows_per_chunk) {
  constexpr int K = Fn::kCount;
  __shared__ float part[K][kRowLanes][kColTile + 1];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = chunk * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  float sums[K] = {};
  if (col < C) {
    float v[K];
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      fn(r, col, C, v);
#pragma unroll
      for (int k = 0; k < K; ++k)
        sums[k] += v[k];
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k)
    part[k][threadIdx.y][threadIdx.x] = sums[k];
  __syncthreads();
  if (threadIdx.y == 0 && col < C) {
    for (int k = 0; k < K; ++k) {
      float total = 0.0f;
      for (int y = 0; y < kRowLanes; ++y)
        total += part[k][y][threadIdx.x];
      partial[(k * static_cast<int64_t>(gridDim.y) + chunk) * C + col] = total;
    }
  }
}

struct ColumnTargets {
  float* dst[2];
};

template <int K>
__global__ void column_finish_kernel(ColumnTargets targets, const float* partial, int64_t chunks,
                                     int64_t C) {
  for (int64_t c = first_index(); c < C; c += grid_stride()) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (targets.dst[k] == nullptr) continue;
      float total = 0.0f;
      for (int64_t chunk = 0; chunk < chunks; ++chunk)
        total += partial[(k * chunks + chunk) * C + c];
      targets.dst[k][c] += total;
    }
  }
}

// ---- normalisation (one block per row) ---------------------------------------------------------

__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                         const float* weight, const float* bias, int64_t C,
                                         float eps) {
  const int64_t row = blockIdx.x;
  const float* x = inp + row * C;
  float* y = out + row * C;
  kmath::Welford<float> stats;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
    stats.add(x[j]);
  stats = block_allreduce(stats);
  const float mu = stats.mean;
  const float rs = kmath::rsqrt_eps(stats.variance(), eps);
  if (threadIdx.x == 0) {
    if (mean != nullptr) mean[row] = mu;
    if (rstd != nullptr) rstd[row] = rs;
  }
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
    float v = (x[j] - mu) * rs;
    if (weight != nullptr) v *= weight[j];
    if (bias != nullptr) v += bias[j];
    y[j] = v;
  }
}

// With xhat = (x - mean) rstd and g = dout * weight:
// dx = rstd (g - mean(g) - xhat mean(g xhat)).
__global__ void layernorm_backward_input_kernel(float* dinp, const float* dout, const float* inp,
                                                const float* weight, const float* mean,
                                                const float* rstd, int64_t C) {
  const int64_t row = blockIdx.x;
  const float* x = inp + row * C;
  const float* dy = dout + row * C;
  float* dx = dinp + row * C;
  const float mu = mean[row];
  const float rs = rstd[row];
  Sum2<float> s;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
    float g = weight != nullptr ? dy[j] * weight[j] : dy[j];
    s.a += g;
    s.b += g * (x[j] - mu) * rs;
  }
  s = block_allreduce(s);
  const float mean_g = s.a / static_cast<float>(C);
  const float mean_gx = s.b / static_cast<float>(C);
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
    float g = weight != nullptr ? dy[j] * weight[j] : dy[j];
    float xhat = (x[j] - mu) * rs;
    dx[j] += rs * (g - mean_g - xhat * mean_gx);
  }
}

__global__ void rmsnorm_forward_kernel(float* out, float* rstd, const float* inp, int64_t C,
                                       float eps) {
  const int64_t row = blockIdx.x;
  const float* x = inp + row * C;
  float* y = out + row * C;
  Sum<float> ss;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
    ss.value += x[j] * x[j];
  ss = block_allreduce(ss);
  const float rs = kmath::rsqrt_eps(ss.value / static_cast<float>(C), eps);
  if (threadIdx.x == 0 && rstd != nullptr) rstd[row] = rs;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
    y[j] = x[j] * rs;
}

// With y = x rstd: dx = rstd (dout - y mean(dout y)).
__global__ void rmsnorm_backward_kernel(float* dinp, const float* dout, const float* inp,
                                        const float* rstd, int64_t C) {
  const int64_t row = blockIdx.x;
  const float* x = inp + row * C;
  const float* dy = dout + row * C;
  float* dx = dinp + row * C;
  const float rs = rstd[row];
  Sum<float> s;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
    s.value += dy[j] * x[j] * rs;
  s = block_allreduce(s);
  const float mean_gy = s.value / static_cast<float>(C);
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
    dx[j] += rs * (dy[j] - x[j] * rs * mean_gy);
  }
}

__global__ void softmax_forward_kernel(float* out, const float* inp, int64_t C) {
  const int64_t row = blockIdx.x;
  const float* x = inp + row * C;
  float* y = out + row * C;
  kmath::OnlineSoftmax<float> norm;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
    norm.add(x[j]);
  norm = block_allreduce(norm);
  const float lse = norm.log_sum_exp();
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
    y[j] = expf(x[j] - lse);
}

// dx = p (dout - sum(dout p)) for the saved probabilities p.
__global__ void softmax_backward_kernel(float* dinp, const float* dout, const float* out,
                                        int64_t C) {
  const int64_t row = blockIdx.x;
  const float* p = out + row * C;
  const float* dy = dout + row * C;
  float* dx = dinp + row * C;
  Sum<float> s;
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
    s.value += dy[j] * p[j];
  s = block_allreduce(s);
  for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
    dx[j] += p[j] * (dy[j] - s.value);
}

// ---- embeddings --------------------------------------------------------------------------------

__global__ void embedding_forward_kernel(float* out, const int32_t* tokens, const float* wte,
                                         const float* wpe, int64_t T, int64_t D, int64_t total,
                                         int* status) {
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t bt = i / D;
    const int64_t d = i % D;
    const int32_t token = tokens[bt];
    if (token < 0) {
      cuda_detail::raise_status(status, cuda_detail::kStatusNegativeTokenId, bt);
      out[i] = 0.0f;
      continue;
    }
    float v = wte[static_cast<int64_t>(token) * D + d];
    if (wpe != nullptr) v += wpe[(bt % T) * D + d];
    out[i] = v;
  }
}

// dwpe[t, d] += sum over b of dout[b, t, d]: one thread per (t, d), no atomics needed.
__global__ void embedding_backward_wpe_kernel(float* dwpe, const float* dout, int64_t B, int64_t T,
                                              int64_t D) {
  for (int64_t i = first_index(); i < T * D; i += grid_stride()) {
    float s = 0.0f;
    for (int64_t b = 0; b < B; ++b)
      s += dout[b * T * D + i];
    dwpe[i] += s;
  }
}

// ---- attention layout --------------------------------------------------------------------------

// Index i of a [B, H, T, hd] tensor -> offset of the same element in [B, T, H, hd] (q part of
// qkv [B, T, 3, H, hd] when `parts` = 3, merged output [B, T, H*hd] when `parts` = 1).
__device__ inline int64_t bthd_offset(int64_t i, int64_t T, int64_t H, int64_t hd, int64_t parts) {
  const int64_t e = i % hd;
  const int64_t t = (i / hd) % T;
  const int64_t h = (i / (hd * T)) % H;
  const int64_t b = i / (hd * T * H);
  return ((b * T + t) * parts * H + h) * hd + e;
}

__global__ void split_heads_kernel(float* q, float* k, float* v, const float* qkv, int64_t T,
                                   int64_t H, int64_t hd, int64_t total) {
  const int64_t part = H * hd;  // distance between the q, k and v blocks of one token
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t src = bthd_offset(i, T, H, hd, 3);
    q[i] = qkv[src];
    k[i] = qkv[src + part];
    v[i] = qkv[src + 2 * part];
  }
}

__global__ void split_heads_backward_kernel(float* dqkv, const float* dq, const float* dk,
                                            const float* dv, int64_t T, int64_t H, int64_t hd,
                                            int64_t total) {
  const int64_t part = H * hd;
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t dst = bthd_offset(i, T, H, hd, 3);
    dqkv[dst] += dq[i];
    dqkv[dst + part] += dk[i];
    dqkv[dst + 2 * part] += dv[i];
  }
}

__global__ void merge_heads_kernel(float* out, const float* a, int64_t T, int64_t H, int64_t hd,
                                   int64_t total) {
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    out[bthd_offset(i, T, H, hd, 1)] = a[i];
  }
}

__global__ void merge_heads_backward_kernel(float* da, const float* dout, int64_t T, int64_t H,
                                            int64_t hd, int64_t total) {
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    da[i] += dout[bthd_offset(i, T, H, hd, 1)];
  }
}

// One thread per rotated pair (j, j + half) of row (bh, t) of x [BH, T, hd].
__global__ void rotary_kernel(float* out, const float* inp, int64_t T, int64_t hd, float base,
                              bool backward, int64_t pairs) {
  const int64_t half = hd / 2;
  for (int64_t i = first_index(); i < pairs; i += grid_stride()) {
    const int64_t j = i % half;
    const int64_t row = i / half;  // bh * T + t
    const int64_t t = row % T;
    const int64_t off = row * hd + j;
    float x0 = inp[off];
    float x1 = inp[off + half];
    kmath::rotary_pair(x0, x1, t, j, half, base, backward);
    if (backward) {
      out[off] += x0;
      out[off + half] += x1;
    } else {
      out[off] = x0;
      out[off + half] = x1;
    }
  }
}

// Row (bh, i) of the scaled scores att [BH, T, T] -> causal softmax over columns j <= i, zeros
// above the diagonal. One block per row.
__global__ void causal_softmax_kernel(float* att, int64_t T) {
  const int64_t row = blockIdx.x;
  const int64_t i = row % T;
  float* p = att + row * T;
  kmath::OnlineSoftmax<float> norm;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x)
    norm.add(p[j]);
  norm = block_allreduce(norm);
  const float lse = norm.log_sum_exp();
  for (int64_t j = threadIdx.x; j < T; j += blockDim.x)
    p[j] = j <= i ? expf(p[j] - lse) : 0.0f;
}

// In place: datt (gradient w.r.t. the probabilities) -> gradient w.r.t. the scaled scores,
// d_j = p_j (datt_j - sum_{l <= i} datt_l p_l) for j <= i, 0 above the diagonal.
__global__ void causal_softmax_backward_kernel(float* datt, const float* att, int64_t T) {
  const int64_t row = blockIdx.x;
  const int64_t i = row % T;
  float* d = datt + row * T;
  const float* p = att + row * T;
  Sum<float> s;
  for (int64_t j = threadIdx.x; j <= i; j += blockDim.x)
    s.value += d[j] * p[j];
  s = block_allreduce(s);
  for (int64_t j = threadIdx.x; j < T; j += blockDim.x) {
    d[j] = j <= i ? p[j] * (d[j] - s.value) : 0.0f;
  }
}

// ---- loss --------------------------------------------------------------------------------------

// One block per row of logits [N, Vp]; the softmax runs over the first V (soft-capped) columns.
// dlogits may alias logits: every read of a row happens before the barrier that precedes the
// first write.
__global__ void cross_entropy_kernel(float* losses, float* dlogits, const float* logits,
                                     const int32_t* targets, int64_t V, int64_t Vp, float cap,
                                     float dloss_scale, int* status) {
  const int64_t row = blockIdx.x;
  const float* z = logits + row * Vp;
  const int32_t target = targets[row];
  const bool valid = target >= 0 && target < V;
  kmath::OnlineSoftmax<float> norm;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
    norm.add(kmath::softcap(z[j], cap));
  norm = block_allreduce(norm);
  const float lse = norm.log_sum_exp();
  if (threadIdx.x == 0) {
    if (valid) {
      if (losses != nullptr) losses[row] = lse - kmath::softcap(z[target], cap);
    } else {
      if (losses != nullptr) losses[row] = NAN;
      cuda_detail::raise_status(status, cuda_detail::kStatusTargetOutOfRange, row);
    }
  }
  if (dlogits == nullptr) return;  // uniform across the block: no thread skips a barrier
  __syncthreads();
  float* dz = dlogits + row * Vp;
  for (int64_t j = threadIdx.x; j < Vp; j += blockDim.x) {
    float g = 0.0f;
    if (j < V && valid) {
      const float zj = z[j];
      const float p = expf(kmath::softcap(zj, cap) - lse);
      g = dloss_scale * (p - (j == target ? 1.0f : 0.0f)) * kmath::softcap_grad(zj, cap);
    }
    dz[j] = g;
  }
}

// ---- row gather / scatter ----------------------------------------------------------------------

__global__ void gather_rows_kernel(float* out, const float* src, const int32_t* index,
                                   const float* weight, int64_t D, int64_t total, int* status) {
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t r = i / D;
    const int32_t from = index[r];
    if (from < 0) {
      cuda_detail::raise_status(status, cuda_detail::kStatusNegativeRowIndex, r);
      out[i] = 0.0f;
      continue;
    }
    const float w = weight != nullptr ? weight[r] : 1.0f;
    out[i] = src[static_cast<int64_t>(from) * D + i % D] * w;
  }
}

__global__ void row_dot_kernel(float* out, const float* a, const float* b, int64_t D) {
  const int64_t row = blockIdx.x;
  Sum<float> s;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
    s.value += a[row * D + j] * b[row * D + j];
  s = block_allreduce(s);
  if (threadIdx.x == 0) out[row] = s.value;
}

__global__ void transpose_kernel(float* out, const float* in, int64_t rows, int64_t cols,
                                 int64_t in_stride, int64_t total) {
  for (int64_t o = first_index(); o < total; o += grid_stride()) {
    // o indexes out [batch, cols, rows] at (b, j, i); read in[b] [rows, cols] at (i, j).
    const int64_t i = o % rows;
    const int64_t j = (o / rows) % cols;
    const int64_t b = o / (rows * cols);
    out[o] = in[b * in_stride + i * cols + j];
  }
}

__global__ void flag_non_finite_kernel(const float* a, int64_t size, int64_t total, int* status) {
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    if (!isfinite(a[i]))
      cuda_detail::raise_status(status, cuda_detail::kStatusNonFiniteInput, i / size);
  }
}

void check_sizes(const std::string& where, std::initializer_list<int64_t> sizes) {
  for (int64_t s : sizes)
    ENGINE_CHECK(s >= 0, where + ": negative size " + std::to_string(s));
}

}  // namespace

void cuda_detail::transpose_batched(float* out, const float* in, int64_t batch, int64_t rows,
                                    int64_t cols, int64_t in_stride, cudaStream_t stream) {
  const int64_t total = batch * rows * cols;
  if (total == 0) return;
  transpose_kernel<<<grid_for(total), kThreads, 0, stream>>>(out, in, rows, cols, in_stride, total);
  ENGINE_CUDA_LAUNCHED();
}

void cuda_detail::flag_non_finite(const float* a, int64_t size, int64_t batch, int* status,
                                  cudaStream_t stream) {
  const int64_t total = size * batch;
  if (total == 0) return;
  flag_non_finite_kernel<<<grid_for(total), kThreads, 0, stream>>>(a, size, total, status);
  ENGINE_CUDA_LAUNCHED();
}

namespace {

// dst[k][c] += sum over rows of fn's k-th value at (row, c), for the K = Fn::kCount targets.
template <typename Fn>
void column_sums(Allocator& allocator, cudaStream_t stream, ColumnTargets targets, Fn fn, int64_t N,
                 int64_t C, const char* op) {
  if (N == 0 || C == 0) return;
  int64_t chunks = (N + kRowsPerChunkMin - 1) / kRowsPerChunkMin;
  chunks = chunks < kMaxChunks ? chunks : kMaxChunks;
  const int64_t rows_per_chunk = (N + chunks - 1) / chunks;
  DeviceBuffer<float> partial(allocator, Fn::kCount * chunks * C);
  const dim3 grid(grid_rows((C + kColTile - 1) / kColTile, op), static_cast<unsigned>(chunks));
  column_partials_kernel<<<grid, dim3(kColTile, kRowLanes), 0, stream>>>(partial.get(), fn, N, C,
                                                                         rows_per_chunk);
  ENGINE_CUDA_LAUNCHED();
  column_finish_kernel<Fn::kCount>
      <<<grid_for(C), kThreads, 0, stream>>>(targets, partial.get(), chunks, C);
  ENGINE_CUDA_LAUNCHED();
}

}  // namespace

// ---- model: loss reduction, MoE routing; rows scattered in order --------------------------------

namespace {

__global__ void iota_kernel(int32_t* out, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    out[i] = static_cast<int32_t>(i);
}

// One block per sorted position; the block at the first position of a destination row adds that
// row's sources in position order (order[] is ascending within a group), so the sum has the
// CPU's order and does not depend on scheduling. The other blocks return at once.
__global__ void scatter_sorted_rows_kernel(float* dst, const float* src, const int32_t* sorted_to,
                                           const int32_t* order, const float* weight, int64_t n,
                                           int64_t D, int negative_code, int* status) {
  const int64_t i = blockIdx.x;
  const int32_t to = sorted_to[i];
  if (i > 0 && sorted_to[i - 1] == to) return;
  if (to < 0) {
    if (threadIdx.x == 0) cuda_detail::raise_status(status, negative_code, order[i]);
    return;
  }
  float* out = dst + static_cast<int64_t>(to) * D;
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
    float acc = out[c];
    for (int64_t j = i; j < n && sorted_to[j] == to; ++j) {
      const int64_t r = order[j];
      acc += src[r * D + c] * (weight != nullptr ? weight[r] : 1.0f);
    }
    out[c] = acc;
  }
}

// dst[index[i], :] += src[i, :] * weight[i] without atomics: a stable radix sort of the
// positions by destination groups the rows, then each destination row is summed in position
// order (as llm.c's deterministic embedding backward). A negative index raises negative_code.
void scatter_rows_in_order(Allocator& allocator, cudaStream_t stream, float* dst, const float* src,
                           const int32_t* index, const float* weight, int64_t n, int64_t D,
                           int negative_code, int* status, const char* op) {
  const int count = cuda_detail::to_int(n, "rows", op);
  DeviceBuffer<int32_t> sorted_to(allocator, n), positions(allocator, n), order(allocator, n);
  iota_kernel<<<grid_for(n), kThreads, 0, stream>>>(positions.get(), n);
  ENGINE_CUDA_LAUNCHED();
  size_t temp_bytes = 0;
  ENGINE_CUDA_CALL(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, index, sorted_to.get(),
                                                   positions.get(), order.get(), count, 0,
                                                   int(8 * sizeof(int32_t)), stream));
  DeviceBuffer<unsigned char> temp(allocator,
                                   static_cast<int64_t>(std::max<size_t>(temp_bytes, 1)));
  ENGINE_CUDA_CALL(cub::DeviceRadixSort::SortPairs(temp.get(), temp_bytes, index, sorted_to.get(),
                                                   positions.get(), order.get(), count, 0,
                                                   int(8 * sizeof(int32_t)), stream));
  scatter_sorted_rows_kernel<<<grid_rows(n, op), kThreads, 0, stream>>>(
      dst, src, sorted_to.get(), order.get(), weight, n, D, negative_code, status);
  ENGINE_CUDA_LAUNCHED();
}

// One block: the float64 sum in a fixed tree order.
__global__ void mean_loss_kernel(float* mean, const float* losses, int64_t n) {
  Sum<double> s;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    s.value += losses[i];
  s = block_allreduce(s);
  if (threadIdx.x == 0) mean[0] = kmath::mean_from_sum<float>(s.value, n);
}

__global__ void accumulate_loss_kernel(double* acc, const float* terms, int64_t k) {
  float total = 0.0f;
  for (int64_t i = 0; i < k; ++i)
    total += terms[i];
  acc[0] += static_cast<double>(total);
}

// One thread per token.
__global__ void moe_top_k_kernel(int32_t* chosen, float* sel_sum, const float* probs, int64_t N,
                                 int64_t E, int64_t K) {
  for (int64_t t = first_index(); t < N; t += grid_stride())
    sel_sum[t] = kmath::moe_top_k(probs + t * E, E, K, chosen + t * K);
}

// One block per expert: how many tokens chose it (into offset[e + 1], made a prefix sum by
// moe_route_finish_kernel) and the float64 sum of its probability over the tokens.
__global__ void moe_expert_stats_kernel(int32_t* offset, double* mass, const int32_t* chosen,
                                        const float* probs, int64_t N, int64_t E, int64_t K) {
  const int32_t e = static_cast<int32_t>(blockIdx.x);
  Sum2<double> s;  // a: count (exact in float64), b: probability mass
  for (int64_t t = threadIdx.x; t < N; t += blockDim.x) {
    for (int64_t j = 0; j < K; ++j)
      s.a += chosen[t * K + j] == e ? 1.0 : 0.0;
    s.b += probs[t * E + e];
  }
  s = block_allreduce(s);
  if (threadIdx.x == 0) {
    offset[e + 1] = static_cast<int32_t>(s.a);
    mass[e] = s.b;
  }
}

// One thread: expert offsets, fractions f_e and the aux loss, experts in order.
__global__ void moe_route_finish_kernel(int32_t* offset, float* frac, float* aux_loss,
                                        const double* mass, int64_t N, int64_t E,
                                        float aux_weight) {
  offset[0] = 0;
  double balance = 0.0;
  for (int64_t e = 0; e < E; ++e) {
    const int32_t count = offset[e + 1];
    frac[e] = kmath::moe_fraction<float>(count, N);
    balance += kmath::moe_balance_term(frac[e], mass[e], N);
    offset[e + 1] = offset[e] + count;
  }
  aux_loss[0] += kmath::moe_aux_loss(aux_weight, E, balance);
}

// One block per expert: its rows in token order, numbered by a block-wide prefix count over
// the tokens that chose it (a token chooses an expert at most once).
__global__ void moe_dispatch_kernel(MoeRouting r, const float* probs, int64_t N, int64_t E,
                                    int64_t K) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  const int32_t e = static_cast<int32_t>(blockIdx.x);
  int next_row = r.offset[e];
  for (int64_t t0 = 0; t0 < N; t0 += kThreads) {
    const int64_t t = t0 + threadIdx.x;
    int64_t slot = -1;
    if (t < N) {
      for (int64_t j = 0; j < K; ++j)
        if (r.chosen[t * K + j] == e) slot = j;
    }
    int before = 0, chunk_total = 0;
    Scan(scan_storage).ExclusiveSum(slot >= 0 ? 1 : 0, before, chunk_total);
    if (slot >= 0) {
      const int row = next_row + before;
      r.slot_row[t * K + slot] = row;
      r.row_token[row] = static_cast<int32_t>(t);
      r.row_gate[row] = kmath::moe_gate(probs[t * E + e], r.sel_sum[t]);
    }
    next_row += chunk_total;
    __syncthreads();  // scan_storage is reused by the next chunk
  }
}

// One thread per token.
__global__ void moe_router_backward_kernel(float* dprobs, MoeRouting r, const float* dgate,
                                           int64_t N, int64_t E, int64_t K, float aux_scale) {
  for (int64_t t = first_index(); t < N; t += grid_stride())
    kmath::moe_router_grad(dprobs + t * E, r.frac, aux_scale, E, r.chosen + t * K,
                           r.slot_row + t * K, dgate, r.row_gate, r.sel_sum[t], K);
}

void check_moe_sizes(const std::string& where, int64_t N, int64_t E, int64_t K) {
  ENGINE_CHECK(N > 0 && K >= 1 && K <= E && E <= INT32_MAX && N * K <= INT32_MAX,
               where + ": need N > 0 tokens and 1 <= K <= E experts (rows fit int32), got N=" +
                   std::to_string(N) + " E=" + std::to_string(E) + " K=" + std::to_string(K));
}

}  // namespace

void CudaBackend::mean_loss(float* mean, const float* losses, int64_t n) {
  ENGINE_CHECK(n > 0, name_ + ": mean_loss: no rows to average");
  mean_loss_kernel<<<1, 1024, 0, stream_>>>(mean, losses, n);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::accumulate_loss(double* acc, const float* terms, int64_t k) {
  check_sizes(name_ + ": accumulate_loss", {k});
  accumulate_loss_kernel<<<1, 1, 0, stream_>>>(acc, terms, k);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::moe_route(const MoeRouting& r, float* aux_loss, const float* probs, int64_t N,
                            int64_t E, int64_t K, float aux_weight) {
  check_moe_sizes(name_ + ": moe_route", N, E, K);
  const unsigned experts = grid_rows(E, "moe_route");
  moe_top_k_kernel<<<grid_for(N), kThreads, 0, stream_>>>(r.chosen, r.sel_sum, probs, N, E, K);
  ENGINE_CUDA_LAUNCHED();
  moe_expert_stats_kernel<<<experts, kThreads, 0, stream_>>>(r.offset, r.mass, r.chosen, probs, N,
                                                             E, K);
  ENGINE_CUDA_LAUNCHED();
  moe_route_finish_kernel<<<1, 1, 0, stream_>>>(r.offset, r.frac, aux_loss, r.mass, N, E,
                                                aux_weight);
  ENGINE_CUDA_LAUNCHED();
  moe_dispatch_kernel<<<experts, kThreads, 0, stream_>>>(r, probs, N, E, K);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::moe_router_backward(float* dprobs, const MoeRouting& r, const float* dgate,
                                      int64_t N, int64_t E, int64_t K, float aux_weight) {
  check_moe_sizes(name_ + ": moe_router_backward", N, E, K);
  const float aux_scale = kmath::moe_aux_grad_scale(aux_weight, E, N);
  moe_router_backward_kernel<<<grid_for(N), kThreads, 0, stream_>>>(dprobs, r, dgate, N, E, K,
                                                                    aux_scale);
  ENGINE_CUDA_LAUNCHED();
}

// ---- Backend methods ---------------------------------------------------------------------------

void CudaBackend::add_bias(float* out, const float* bias, int64_t N, int64_t C) {
  check_sizes(name_ + ": add_bias", {N, C});
  if (N * C == 0) return;
  add_bias_kernel<<<grid_for(N * C), kThreads, 0, stream_>>>(out, bias, N, C);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::bias_backward(float* dbias, const float* dout, int64_t N, int64_t C) {
  check_sizes(name_ + ": bias_backward", {N, C});
  column_sums(allocator_, stream_, {{dbias, nullptr}}, BiasGrad{dout}, N, C, "bias_backward");
}

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

void CudaBackend::axpby(float* y, float a, const float* x, float b, int64_t n) {
  if (n <= 0) return;
  axpby_kernel<<<grid_for(n), kThreads, 0, stream_>>>(y, a, x, b, n);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::gelu_forward(float* out, const float* inp, int64_t n) {
  if (n <= 0) return;
  gelu_forward_kernel<<<grid_for(n), kThreads, 0, stream_>>>(out, inp, n);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  if (n <= 0) return;
  gelu_backward_kernel<<<grid_for(n), kThreads, 0, stream_>>>(dinp, inp, dout, n);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::relu2_forward(float* out, const float* inp, int64_t n) {
  if (n <= 0) return;
  relu2_forward_kernel<<<grid_for(n), kThreads, 0, stream_>>>(out, inp, n);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::relu2_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
  if (n <= 0) return;
  relu2_backward_kernel<<<grid_for(n), kThreads, 0, stream_>>>(dinp, inp, dout, n);
  ENGINE_CUDA_LAUNCHED();
}

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

void CudaBackend::layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                    const float* weight, const float* bias, int64_t N, int64_t C,
                                    float eps) {
  check_sizes(name_ + ": layernorm_forward", {N, C});
  if (N == 0 || C == 0) return;
  layernorm_forward_kernel<<<grid_rows(N, "layernorm_forward"), kThreads, 0, stream_>>>(
      out, mean, rstd, inp, weight, bias, C, eps);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                     const float* inp, const float* weight, const float* mean,
                                     const float* rstd, int64_t N, int64_t C) {
  check_sizes(name_ + ": layernorm_backward", {N, C});
  if (N == 0 || C == 0) return;
  if (dinp != nullptr) {
    layernorm_backward_input_kernel<<<grid_rows(N, "layernorm_backward"), kThreads, 0, stream_>>>(
        dinp, dout, inp, weight, mean, rstd, C);
    ENGINE_CUDA_LAUNCHED();
  }
  if (dweight != nullptr || dbias != nullptr) {
    column_sums(allocator_, stream_, {{dweight, dbias}}, LayerNormParamGrad{dout, inp, mean, rstd},
                N, C, "layernorm_backward");
  }
}

void CudaBackend::rmsnorm_forward(float* out, float* rstd, const float* inp, int64_t N, int64_t C,
                                  float eps) {
  check_sizes(name_ + ": rmsnorm_forward", {N, C});
  if (N == 0 || C == 0) return;
  rmsnorm_forward_kernel<<<grid_rows(N, "rmsnorm_forward"), kThreads, 0, stream_>>>(out, rstd, inp,
                                                                                    C, eps);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::rmsnorm_backward(float* dinp, const float* dout, const float* inp,
                                   const float* rstd, int64_t N, int64_t C) {
  check_sizes(name_ + ": rmsnorm_backward", {N, C});
  if (N == 0 || C == 0) return;
  rmsnorm_backward_kernel<<<grid_rows(N, "rmsnorm_backward"), kThreads, 0, stream_>>>(dinp, dout,
                                                                                      inp, rstd, C);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::softmax_forward(float* out, const float* inp, int64_t N, int64_t C) {
  check_sizes(name_ + ": softmax_forward", {N, C});
  if (N == 0 || C == 0) return;
  softmax_forward_kernel<<<grid_rows(N, "softmax_forward"), kThreads, 0, stream_>>>(out, inp, C);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::softmax_backward(float* dinp, const float* dout, const float* out, int64_t N,
                                   int64_t C) {
  check_sizes(name_ + ": softmax_backward", {N, C});
  if (N == 0 || C == 0) return;
  softmax_backward_kernel<<<grid_rows(N, "softmax_backward"), kThreads, 0, stream_>>>(dinp, dout,
                                                                                      out, C);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::embedding_forward(float* out, const int32_t* tokens, const float* wte,
                                    const float* wpe, int64_t B, int64_t T, int64_t D) {
  check_sizes(name_ + ": embedding_forward", {B, T, D});
  const int64_t total = B * T * D;
  if (total == 0) return;
  embedding_forward_kernel<<<grid_for(total), kThreads, 0, stream_>>>(out, tokens, wte, wpe, T, D,
                                                                      total, status_);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::embedding_backward(float* dwte, float* dwpe, const float* dout,
                                     const int32_t* tokens, int64_t B, int64_t T, int64_t D) {
  check_sizes(name_ + ": embedding_backward", {B, T, D});
  const int64_t total = B * T * D;
  if (total == 0) return;
  if (dwte != nullptr) {
    scatter_rows_in_order(allocator_, stream_, dwte, dout, tokens, nullptr, B * T, D,
                          cuda_detail::kStatusNegativeTokenId, status_, "embedding_backward");
  }
  if (dwpe != nullptr) {
    embedding_backward_wpe_kernel<<<grid_for(T * D), kThreads, 0, stream_>>>(dwpe, dout, B, T, D);
    ENGINE_CUDA_LAUNCHED();
  }
}

void CudaBackend::split_heads(float* q, float* k, float* v, const float* qkv, int64_t B, int64_t T,
                              int64_t H, int64_t hd) {
  check_sizes(name_ + ": split_heads", {B, T, H, hd});
  const int64_t total = B * H * T * hd;
  if (total == 0) return;
  split_heads_kernel<<<grid_for(total), kThreads, 0, stream_>>>(q, k, v, qkv, T, H, hd, total);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::split_heads_backward(float* dqkv, const float* dq, const float* dk,
                                       const float* dv, int64_t B, int64_t T, int64_t H,
                                       int64_t hd) {
  check_sizes(name_ + ": split_heads_backward", {B, T, H, hd});
  const int64_t total = B * H * T * hd;
  if (total == 0) return;
  split_heads_backward_kernel<<<grid_for(total), kThreads, 0, stream_>>>(dqkv, dq, dk, dv, T, H, hd,
                                                                         total);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::merge_heads(float* out, const float* a, int64_t B, int64_t T, int64_t H,
                              int64_t hd) {
  check_sizes(name_ + ": merge_heads", {B, T, H, hd});
  const int64_t total = B * H * T * hd;
  if (total == 0) return;
  merge_heads_kernel<<<grid_for(total), kThreads, 0, stream_>>>(out, a, T, H, hd, total);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::merge_heads_backward(float* da, const float* dout, int64_t B, int64_t T,
                                       int64_t H, int64_t hd) {
  check_sizes(name_ + ": merge_heads_backward", {B, T, H, hd});
  const int64_t total = B * H * T * hd;
  if (total == 0) return;
  merge_heads_backward_kernel<<<grid_for(total), kThreads, 0, stream_>>>(da, dout, T, H, hd, total);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::rotary_forward(float* out, const float* inp, int64_t BH, int64_t T, int64_t hd,
                                 float base) {
  check_sizes(name_ + ": rotary_forward", {BH, T, hd});
  ENGINE_CHECK(hd % 2 == 0,
               name_ + ": rotary_forward: head dimension " + std::to_string(hd) + " is odd");
  const int64_t pairs = BH * T * (hd / 2);
  if (pairs == 0) return;
  rotary_kernel<<<grid_for(pairs), kThreads, 0, stream_>>>(out, inp, T, hd, base, false, pairs);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::rotary_backward(float* dinp, const float* dout, int64_t BH, int64_t T, int64_t hd,
                                  float base) {
  check_sizes(name_ + ": rotary_backward", {BH, T, hd});
  ENGINE_CHECK(hd % 2 == 0,
               name_ + ": rotary_backward: head dimension " + std::to_string(hd) + " is odd");
  const int64_t pairs = BH * T * (hd / 2);
  if (pairs == 0) return;
  rotary_kernel<<<grid_for(pairs), kThreads, 0, stream_>>>(dinp, dout, T, hd, base, true, pairs);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::attention_forward(float* out, float* att, const float* q, const float* k,
                                    const float* v, int64_t BH, int64_t T, int64_t hd,
                                    float scale) {
  check_sizes(name_ + ": attention_forward", {BH, T, hd});
  if (BH == 0 || T == 0) return;
  // att = scale * q k^T per head: [T, hd] x [hd, T].
  gemm({.trans_b = true,
        .m = T,
        .n = T,
        .k = hd,
        .alpha = scale,
        .batch = BH,
        .stride_a = T * hd,
        .stride_b = T * hd,
        .stride_c = T * T},
       q, k, att);
  causal_softmax_kernel<<<grid_rows(BH * T, "attention_forward"), kThreads, 0, stream_>>>(att, T);
  ENGINE_CUDA_LAUNCHED();
  // out = att v: [T, T] x [T, hd].
  gemm({.m = T,
        .n = hd,
        .k = T,
        .batch = BH,
        .stride_a = T * T,
        .stride_b = T * hd,
        .stride_c = T * hd},
       att, v, out);
}

void CudaBackend::attention_backward(float* dq, float* dk, float* dv, float* datt,
                                     const float* dout, const float* att, const float* q,
                                     const float* k, const float* v, int64_t BH, int64_t T,
                                     int64_t hd, float scale) {
  check_sizes(name_ + ": attention_backward", {BH, T, hd});
  if (BH == 0 || T == 0) return;
  // dv += att^T dout.
  gemm({.trans_a = true,
        .m = T,
        .n = hd,
        .k = T,
        .beta = 1.0f,
        .batch = BH,
        .stride_a = T * T,
        .stride_b = T * hd,
        .stride_c = T * hd},
       att, dout, dv);
  // datt = dout v^T, then through the causal softmax to the scaled scores.
  gemm({.trans_b = true,
        .m = T,
        .n = T,
        .k = hd,
        .batch = BH,
        .stride_a = T * hd,
        .stride_b = T * hd,
        .stride_c = T * T},
       dout, v, datt);
  causal_softmax_backward_kernel<<<grid_rows(BH * T, "attention_backward"), kThreads, 0, stream_>>>(
      datt, att, T);
  ENGINE_CUDA_LAUNCHED();
  // scores = scale q k^T: dq += scale dS k, dk += scale dS^T q.
  gemm({.m = T,
        .n = hd,
        .k = T,
        .alpha = scale,
        .beta = 1.0f,
        .batch = BH,
        .stride_a = T * T,
        .stride_b = T * hd,
        .stride_c = T * hd},
       datt, k, dq);
  gemm({.trans_a = true,
        .m = T,
        .n = hd,
        .k = T,
        .alpha = scale,
        .beta = 1.0f,
        .batch = BH,
        .stride_a = T * T,
        .stride_b = T * hd,
        .stride_c = T * hd},
       datt, q, dk);
}

void CudaBackend::cross_entropy(float* losses, float* dlogits, const float* logits,
                                const int32_t* targets, int64_t N, int64_t V, int64_t Vp,
                                float softcap, float dloss_scale) {
  check_sizes(name_ + ": cross_entropy", {N, V, Vp});
  ENGINE_CHECK(V >= 1 && V <= Vp, name_ + ": cross_entropy: V = " + std::to_string(V) +
                                      " must be in [1, Vp = " + std::to_string(Vp) + "]");
  if (N == 0) return;
  cross_entropy_kernel<<<grid_rows(N, "cross_entropy"), kThreads, 0, stream_>>>(
      losses, dlogits, logits, targets, V, Vp, softcap, dloss_scale, status_);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::gather_rows(float* out, const float* src, const int32_t* index,
                              const float* weight, int64_t n, int64_t D) {
  check_sizes(name_ + ": gather_rows", {n, D});
  const int64_t total = n * D;
  if (total == 0) return;
  gather_rows_kernel<<<grid_for(total), kThreads, 0, stream_>>>(out, src, index, weight, D, total,
                                                                status_);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::scatter_add_rows(float* dst, const float* src, const int32_t* index,
                                   const float* weight, int64_t n, int64_t D) {
  check_sizes(name_ + ": scatter_add_rows", {n, D});
  const int64_t total = n * D;
  if (total == 0) return;
  scatter_rows_in_order(allocator_, stream_, dst, src, index, weight, n, D,
                        cuda_detail::kStatusNegativeRowIndex, status_, "scatter_add_rows");
}

void CudaBackend::row_dot(float* out, const float* a, const float* b, int64_t n, int64_t D) {
  check_sizes(name_ + ": row_dot", {n, D});
  if (n == 0) return;
  row_dot_kernel<<<grid_rows(n, "row_dot"), kThreads, 0, stream_>>>(out, a, b, D);
  ENGINE_CUDA_LAUNCHED();
}

// ---- sums of squares of many tensors ----------------------------------------------------------

namespace {

// *out = 0 + x[0] + x[1] + ... in this order (one thread: the order is the host loop's).
__global__ void sum_in_order_kernel(double* out, const double* x, int64_t count) {
  double total = 0;
  for (int64_t i = 0; i < count; ++i)
    total += x[i];
  *out = total;
}

}  // namespace

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

}  // namespace core
