// The CUDA backend's classifier family (core/ops/classifier.h): the fused softmax cross-entropy
// with vocabulary padding and soft-cap, and the loss reductions (float64, fixed order).
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
using cuda_detail::grid_rows;
using cuda_detail::kThreads;
using cuda_detail::Sum;

namespace {

// ---- loss --------------------------------------------------------------------------------------

// One block per row of logits [N, Vp]; the softmax runs over the first V (soft-capped) columns.
// dlogits may alias logits: every read of a row happens before the barrier that precedes the
// first write.
// The d logits element as stored: f32, or bf16 rounded once (bf16 precision).
__device__ inline void store_gradient(float* dz, float g) {
  *dz = g;
}
__device__ inline void store_gradient(bf16* dz, float g) {
  *dz = kmath::bf16_from_float(g);
}

template <typename G>
__global__ void cross_entropy_kernel(float* losses, G* dlogits, const float* logits,
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
  G* dz = dlogits + row * Vp;
  for (int64_t j = threadIdx.x; j < Vp; j += blockDim.x) {
    float g = 0.0f;
    if (j < V && valid) {
      const float zj = z[j];
      const float p = expf(kmath::softcap(zj, cap) - lse);
      g = dloss_scale * (p - (j == target ? 1.0f : 0.0f)) * kmath::softcap_grad(zj, cap);
    }
    store_gradient(dz + j, g);
  }
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

}  // namespace

namespace {

// The checks and the launch both cross-entropies share (G: the d logits' element type).
template <typename G>
void launch_cross_entropy(const std::string& name, cudaStream_t stream, int* status, float* losses,
                          G* dlogits, const float* logits, const int32_t* targets, int64_t N,
                          int64_t V, int64_t Vp, float softcap, float dloss_scale) {
  check_sizes(name + ": cross_entropy", {N, V, Vp});
  ENGINE_CHECK(V >= 1 && V <= Vp, name + ": cross_entropy: V = " + std::to_string(V) +
                                      " must be in [1, Vp = " + std::to_string(Vp) + "]");
  if (N == 0) return;
  cross_entropy_kernel<<<grid_rows(N, "cross_entropy"), kThreads, 0, stream>>>(
      losses, dlogits, logits, targets, V, Vp, softcap, dloss_scale, status);
  ENGINE_CUDA_LAUNCHED();
}

}  // namespace

void CudaBackend::cross_entropy(float* losses, float* dlogits, const float* logits,
                                const int32_t* targets, int64_t N, int64_t V, int64_t Vp,
                                float softcap, float dloss_scale) {
  launch_cross_entropy(name_, stream_, status_, losses, dlogits, logits, targets, N, V, Vp, softcap,
                       dloss_scale);
}

void CudaBackend::cross_entropy_bf16(float* losses, bf16* dlogits, const float* logits,
                                     const int32_t* targets, int64_t N, int64_t V, int64_t Vp,
                                     float softcap, float dloss_scale) {
  ENGINE_CHECK(dlogits != nullptr, name_ + ": cross_entropy_bf16: needs dlogits");
  launch_cross_entropy(name_, stream_, status_, losses, dlogits, logits, targets, N, V, Vp, softcap,
                       dloss_scale);
}

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

}  // namespace core
