// The CUDA backend's attention family (core/ops/attention.h): head layout, rotary positions
// (kernel_math.h) and causal attention as cuBLAS batched GEMMs around a row-wise causal softmax.
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
using cuda_detail::first_index;
using cuda_detail::grid_for;
using cuda_detail::grid_rows;
using cuda_detail::grid_stride;
using cuda_detail::kThreads;
using cuda_detail::Sum;

namespace {

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

}  // namespace

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

}  // namespace core
