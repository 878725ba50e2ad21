// The CUDA backend's norms family (core/ops/norms.h): LayerNorm, RMSNorm and the row softmax, one
// block per row; the LayerNorm parameter gradients are fixed-order column sums.
#include <cuda_runtime.h>

#include <string>

#include "core/check.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_launch.cuh"
#include "core/cuda/cuda_reduce.cuh"
#include "core/kernel_math.h"

namespace core {

using cuda_detail::block_allreduce;
using cuda_detail::check_sizes;
using cuda_detail::column_sums;
using cuda_detail::grid_rows;
using cuda_detail::kThreads;
using cuda_detail::Sum;
using cuda_detail::Sum2;

namespace {

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

}  // namespace

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

}  // namespace core
