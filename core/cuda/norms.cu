// The CUDA backend's norms family (core/ops/norms.h): LayerNorm and RMSNorm one warp per row (the
// input f32, or bf16 widened as it is loaded), the row softmax one block per row; the LayerNorm
// parameter gradients are fixed-order column sums.
#include <cuda_runtime.h>

#include <initializer_list>
#include <string>
#include <type_traits>

#include "core/check.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_launch.cuh"
#include "core/cuda/cuda_reduce.cuh"
#include "core/kernel_math.h"

namespace core {

using cuda_detail::block_allreduce;
using cuda_detail::check_sizes;
using cuda_detail::column_sums;
using cuda_detail::FloatPack;
using cuda_detail::grid_rows;
using cuda_detail::kThreads;
using cuda_detail::load_pack;
using cuda_detail::pack_width;
using cuda_detail::row_group_sum;
using cuda_detail::store_pack;
using cuda_detail::Sum;

namespace {

__device__ inline float widen(float x) {
  return x;
}
__device__ inline float widen(bf16 x) {
  return kmath::float_from_bf16(x);
}

// Values of the LayerNorm parameter gradients: dout * xhat (weight) and dout (bias); the input
// f32 or bf16 (widened).
template <typename In>
struct LayerNormParamGrad {
  static constexpr int kCount = 2;
  const float* dout;
  const In* inp;
  const float* mean;
  const float* rstd;
  __device__ void operator()(int64_t r, int64_t c, int64_t C, float* v) const {
    const float g = dout[r * C + c];
    v[0] = g * (widen(inp[r * C + c]) - mean[r]) * rstd[r];
    v[1] = g;
  }
};

// ---- normalisation (one warp per row) ----------------------------------------------------------
//
// Norm rows are short (C from a head's 64 to a few thousand), so a warp takes a row (kRowsPerBlock
// rows a block) and its reductions are shuffles with no block barrier; the lanes stride the row W
// floats at a time and read it again from L1 for each pass. Mean and variance in two passes, as
// the CPU computes them. A warp past the last row leaves whole (row is the same on all its lanes).

constexpr int kRowsPerBlock = kThreads / 32;

__device__ inline int64_t warp_row() {
  return static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
}
__device__ inline int lane() {
  return static_cast<int>(threadIdx.x % 32);
}

// A pack of a normalised row stored as f32, or rounded to bf16 (bf16 precision's GEMM inputs).
template <int W>
__device__ inline void store_row_pack(float* y, const FloatPack<W>& p) {
  store_pack<W>(y, p);
}
template <int W>
__device__ inline void store_row_pack(bf16* y, const FloatPack<W>& p) {
#pragma unroll
  for (int i = 0; i < W; ++i)
    y[i] = kmath::bf16_from_float(p.v[i]);
}

// A pack of a row read as f32: loaded, or widened from bf16 (bf16 precision's residual stream;
// element loads, so the pack width asks nothing of a bf16 row's alignment).
template <int W>
__device__ inline FloatPack<W> load_row_pack(const float* x) {
  return load_pack<W>(x);
}
template <int W>
__device__ inline FloatPack<W> load_row_pack(const bf16* x) {
  FloatPack<W> p;
#pragma unroll
  for (int i = 0; i < W; ++i)
    p.v[i] = kmath::float_from_bf16(x[i]);
  return p;
}

template <int W, typename Out, typename In>
__global__ void layernorm_forward_kernel(Out* out, float* mean, float* rstd, const In* inp,
                                         const float* weight, const float* bias, int64_t N,
                                         int64_t C, float eps) {
  const int64_t row = warp_row();
  if (row >= N) return;
  const In* x = inp + row * C;
  Out* y = out + row * C;
  float sum = 0.0f;
  for (int64_t j = lane() * W; j < C; j += 32 * W) {
    const FloatPack<W> p = load_row_pack<W>(x + j);
#pragma unroll
    for (int i = 0; i < W; ++i)
      sum += p.v[i];
  }
  const float mu = row_group_sum<32>(sum) / static_cast<float>(C);
  float sq = 0.0f;
  for (int64_t j = lane() * W; j < C; j += 32 * W) {
    const FloatPack<W> p = load_row_pack<W>(x + j);
#pragma unroll
    for (int i = 0; i < W; ++i)
      sq += (p.v[i] - mu) * (p.v[i] - mu);
  }
  const float rs = kmath::rsqrt_eps(row_group_sum<32>(sq) / static_cast<float>(C), eps);
  if (lane() == 0) {
    if (mean != nullptr) mean[row] = mu;
    if (rstd != nullptr) rstd[row] = rs;
  }
  for (int64_t j = lane() * W; j < C; j += 32 * W) {
    FloatPack<W> p = load_row_pack<W>(x + j);
    const FloatPack<W> wp = weight != nullptr ? load_pack<W>(weight + j) : FloatPack<W>{};
    const FloatPack<W> bp = bias != nullptr ? load_pack<W>(bias + j) : FloatPack<W>{};
#pragma unroll
    for (int i = 0; i < W; ++i) {
      float v = (p.v[i] - mu) * rs;
      if (weight != nullptr) v *= wp.v[i];
      if (bias != nullptr) v += bp.v[i];
      p.v[i] = v;
    }
    store_row_pack<W>(y + j, p);
  }
}

// With xhat = (x - mean) rstd and g = dout * weight:
// dx = rstd (g - mean(g) - xhat mean(g xhat)).
template <int W, typename In>
__global__ void layernorm_backward_input_kernel(float* dinp, const float* dout, const In* inp,
                                                const float* weight, const float* mean,
                                                const float* rstd, int64_t N, int64_t C) {
  const int64_t row = warp_row();
  if (row >= N) return;
  const In* x = inp + row * C;
  const float* dy = dout + row * C;
  float* dx = dinp + row * C;
  const float mu = mean[row];
  const float rs = rstd[row];
  float sum_g = 0.0f, sum_gx = 0.0f;
  for (int64_t j = lane() * W; j < C; j += 32 * W) {
    const FloatPack<W> xp = load_row_pack<W>(x + j), gp = load_pack<W>(dy + j);
    const FloatPack<W> wp = weight != nullptr ? load_pack<W>(weight + j) : FloatPack<W>{};
#pragma unroll
    for (int i = 0; i < W; ++i) {
      const float g = weight != nullptr ? gp.v[i] * wp.v[i] : gp.v[i];
      sum_g += g;
      sum_gx += g * (xp.v[i] - mu) * rs;
    }
  }
  const float mean_g = row_group_sum<32>(sum_g) / static_cast<float>(C);
  const float mean_gx = row_group_sum<32>(sum_gx) / static_cast<float>(C);
  for (int64_t j = lane() * W; j < C; j += 32 * W) {
    const FloatPack<W> xp = load_row_pack<W>(x + j), gp = load_pack<W>(dy + j);
    const FloatPack<W> wp = weight != nullptr ? load_pack<W>(weight + j) : FloatPack<W>{};
    FloatPack<W> acc = load_pack<W>(dx + j);
#pragma unroll
    for (int i = 0; i < W; ++i) {
      const float g = weight != nullptr ? gp.v[i] * wp.v[i] : gp.v[i];
      const float xhat = (xp.v[i] - mu) * rs;
      acc.v[i] += rs * (g - mean_g - xhat * mean_gx);
    }
    store_pack<W>(dx + j, acc);
  }
}

template <int W, typename Out, typename In>
__global__ void rmsnorm_forward_kernel(Out* out, float* rstd, const In* inp, int64_t N, int64_t C,
                                       float eps) {
  const int64_t row = warp_row();
  if (row >= N) return;
  const In* x = inp + row * C;
  Out* y = out + row * C;
  float sq = 0.0f;
  for (int64_t j = lane() * W; j < C; j += 32 * W) {
    const FloatPack<W> p = load_row_pack<W>(x + j);
#pragma unroll
    for (int i = 0; i < W; ++i)
      sq += p.v[i] * p.v[i];
  }
  const float rs = kmath::rsqrt_eps(row_group_sum<32>(sq) / static_cast<float>(C), eps);
  if (lane() == 0 && rstd != nullptr) rstd[row] = rs;
  for (int64_t j = lane() * W; j < C; j += 32 * W) {
    FloatPack<W> p = load_row_pack<W>(x + j);
#pragma unroll
    for (int i = 0; i < W; ++i)
      p.v[i] *= rs;
    store_row_pack<W>(y + j, p);
  }
}

// With y = x rstd: dx = rstd (dout - y mean(dout y)).
template <int W, typename In>
__global__ void rmsnorm_backward_kernel(float* dinp, const float* dout, const In* inp,
                                        const float* rstd, int64_t N, int64_t C) {
  const int64_t row = warp_row();
  if (row >= N) return;
  const In* x = inp + row * C;
  const float* dy = dout + row * C;
  float* dx = dinp + row * C;
  const float rs = rstd[row];
  float s = 0.0f;
  for (int64_t j = lane() * W; j < C; j += 32 * W) {
    const FloatPack<W> xp = load_row_pack<W>(x + j), gp = load_pack<W>(dy + j);
#pragma unroll
    for (int i = 0; i < W; ++i)
      s += gp.v[i] * xp.v[i] * rs;
  }
  const float mean_gy = row_group_sum<32>(s) / static_cast<float>(C);
  for (int64_t j = lane() * W; j < C; j += 32 * W) {
    const FloatPack<W> xp = load_row_pack<W>(x + j), gp = load_pack<W>(dy + j);
    FloatPack<W> acc = load_pack<W>(dx + j);
#pragma unroll
    for (int i = 0; i < W; ++i)
      acc.v[i] += rs * (gp.v[i] - xp.v[i] * rs * mean_gy);
    store_pack<W>(dx + j, acc);
  }
}

// Runs a warp-per-row kernel over N rows: launch(W, grid) with W = 4 where C and every pointer
// allow it.
template <typename Launch>
void launch_rows(int64_t N, int64_t C, std::initializer_list<const void*> pointers, const char* op,
                 Launch launch) {
  const int64_t blocks = (N + kRowsPerBlock - 1) / kRowsPerBlock;
  const dim3 grid(grid_rows(blocks, op));
  if (pack_width(C, pointers) == 4) {
    launch(std::integral_constant<int, 4>{}, grid);
  } else {
    launch(std::integral_constant<int, 1>{}, grid);
  }
  ENGINE_CUDA_LAUNCHED();
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

}  // namespace

void CudaBackend::layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                                    const float* weight, const float* bias, int64_t N, int64_t C,
                                    float eps) {
  check_sizes(name_ + ": layernorm_forward", {N, C});
  if (N == 0 || C == 0) return;
  launch_rows(N, C, {out, inp, weight, bias}, "layernorm_forward", [&](auto w, dim3 grid) {
    layernorm_forward_kernel<decltype(w)::value>
        <<<grid, kThreads, 0, stream_>>>(out, mean, rstd, inp, weight, bias, N, C, eps);
  });
}

void CudaBackend::layernorm_forward(bf16* out, float* mean, float* rstd, const float* inp,
                                    const float* weight, const float* bias, int64_t N, int64_t C,
                                    float eps) {
  check_sizes(name_ + ": layernorm_forward", {N, C});
  if (N == 0 || C == 0) return;
  launch_rows(N, C, {inp, weight, bias}, "layernorm_forward", [&](auto w, dim3 grid) {
    layernorm_forward_kernel<decltype(w)::value>
        <<<grid, kThreads, 0, stream_>>>(out, mean, rstd, inp, weight, bias, N, C, eps);
  });
}

void CudaBackend::layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                     const float* inp, const float* weight, const float* mean,
                                     const float* rstd, int64_t N, int64_t C) {
  check_sizes(name_ + ": layernorm_backward", {N, C});
  if (N == 0 || C == 0) return;
  if (dinp != nullptr) {
    launch_rows(N, C, {dinp, dout, inp, weight}, "layernorm_backward", [&](auto w, dim3 grid) {
      layernorm_backward_input_kernel<decltype(w)::value>
          <<<grid, kThreads, 0, stream_>>>(dinp, dout, inp, weight, mean, rstd, N, C);
    });
  }
  if (dweight != nullptr || dbias != nullptr) {
    column_sums(allocator_, stream_, {{dweight, dbias}},
                LayerNormParamGrad<float>{dout, inp, mean, rstd}, N, C, "layernorm_backward");
  }
}

void CudaBackend::rmsnorm_forward(float* out, float* rstd, const float* inp, int64_t N, int64_t C,
                                  float eps) {
  check_sizes(name_ + ": rmsnorm_forward", {N, C});
  if (N == 0 || C == 0) return;
  launch_rows(N, C, {out, inp}, "rmsnorm_forward", [&](auto w, dim3 grid) {
    rmsnorm_forward_kernel<decltype(w)::value>
        <<<grid, kThreads, 0, stream_>>>(out, rstd, inp, N, C, eps);
  });
}

void CudaBackend::rmsnorm_forward(bf16* out, float* rstd, const float* inp, int64_t N, int64_t C,
                                  float eps) {
  check_sizes(name_ + ": rmsnorm_forward", {N, C});
  if (N == 0 || C == 0) return;
  launch_rows(N, C, {inp}, "rmsnorm_forward", [&](auto w, dim3 grid) {
    rmsnorm_forward_kernel<decltype(w)::value>
        <<<grid, kThreads, 0, stream_>>>(out, rstd, inp, N, C, eps);
  });
}

void CudaBackend::rmsnorm_backward(float* dinp, const float* dout, const float* inp,
                                   const float* rstd, int64_t N, int64_t C) {
  check_sizes(name_ + ": rmsnorm_backward", {N, C});
  if (N == 0 || C == 0) return;
  launch_rows(N, C, {dinp, dout, inp}, "rmsnorm_backward", [&](auto w, dim3 grid) {
    rmsnorm_backward_kernel<decltype(w)::value>
        <<<grid, kThreads, 0, stream_>>>(dinp, dout, inp, rstd, N, C);
  });
}

void CudaBackend::layernorm_forward(bf16* out, float* mean, float* rstd, const bf16* inp,
                                    const float* weight, const float* bias, int64_t N, int64_t C,
                                    float eps) {
  check_sizes(name_ + ": layernorm_forward", {N, C});
  if (N == 0 || C == 0) return;
  launch_rows(N, C, {weight, bias}, "layernorm_forward", [&](auto w, dim3 grid) {
    layernorm_forward_kernel<decltype(w)::value>
        <<<grid, kThreads, 0, stream_>>>(out, mean, rstd, inp, weight, bias, N, C, eps);
  });
}

void CudaBackend::layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                                     const bf16* inp, const float* weight, const float* mean,
                                     const float* rstd, int64_t N, int64_t C) {
  check_sizes(name_ + ": layernorm_backward", {N, C});
  if (N == 0 || C == 0) return;
  if (dinp != nullptr) {
    launch_rows(N, C, {dinp, dout, weight}, "layernorm_backward", [&](auto w, dim3 grid) {
      layernorm_backward_input_kernel<decltype(w)::value>
          <<<grid, kThreads, 0, stream_>>>(dinp, dout, inp, weight, mean, rstd, N, C);
    });
  }
  if (dweight != nullptr || dbias != nullptr) {
    column_sums(allocator_, stream_, {{dweight, dbias}},
                LayerNormParamGrad<bf16>{dout, inp, mean, rstd}, N, C, "layernorm_backward");
  }
}

void CudaBackend::rmsnorm_forward(bf16* out, float* rstd, const bf16* inp, int64_t N, int64_t C,
                                  float eps) {
  check_sizes(name_ + ": rmsnorm_forward", {N, C});
  if (N == 0 || C == 0) return;
  launch_rows(N, C, {}, "rmsnorm_forward", [&](auto w, dim3 grid) {
    rmsnorm_forward_kernel<decltype(w)::value>
        <<<grid, kThreads, 0, stream_>>>(out, rstd, inp, N, C, eps);
  });
}

void CudaBackend::rmsnorm_backward(float* dinp, const float* dout, const bf16* inp,
                                   const float* rstd, int64_t N, int64_t C) {
  check_sizes(name_ + ": rmsnorm_backward", {N, C});
  if (N == 0 || C == 0) return;
  launch_rows(N, C, {dinp, dout}, "rmsnorm_backward", [&](auto w, dim3 grid) {
    rmsnorm_backward_kernel<decltype(w)::value>
        <<<grid, kThreads, 0, stream_>>>(dinp, dout, inp, rstd, N, C);
  });
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

}  // namespace core
