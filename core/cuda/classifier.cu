// The CUDA backend's classifier family (core/ops/classifier.h): the fused softmax cross-entropy
// with vocabulary padding and soft-cap on f32 logits (two passes over the row in HBM) and on bf16
// logits (the row read from HBM once into shared memory, where it fits; classifier_path.h), and
// the loss reductions (float64, fixed order).
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/check.h"
#include "core/cuda/classifier_path.h"
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

// A logit as the softmax reads it: f32, or bf16 widened exactly.
__device__ inline float logit_value(const float* z, int64_t j) {
  return z[j];
}
__device__ inline float logit_value(const bf16* z, int64_t j) {
  return kmath::float_from_bf16(z[j]);
}

// The d logits element as stored: f32, or bf16 rounded once (bf16 precision).
__device__ inline void store_gradient(float* dz, float g) {
  *dz = g;
}
__device__ inline void store_gradient(bf16* dz, float g) {
  *dz = kmath::bf16_from_float(g);
}

// Whether every term of the row reads a column in [0, V).
__device__ inline bool terms_in_range(const kmath::PositionTerms<float>& pos, int64_t V) {
  bool ok = true;
  for (int i = 0; i < kmath::LossTerms::kMaxTerms; ++i)
    ok = ok && pos.target[i] < V;
  return ok;
}

// One row's normaliser into the row's loss (thread 0), as every kernel below ends its first
// pass: `norm` holds this thread's part; the terms' logits are read by thread 0 only.
template <typename L>
__device__ float row_lse(kmath::OnlineSoftmax<float> norm, float* losses, const L* z,
                         const kmath::PositionTerms<float>& pos, bool valid, float cap,
                         int* status) {
  norm = block_allreduce(norm);
  const float lse = norm.log_sum_exp();
  if (threadIdx.x == 0) {
    const int64_t row = blockIdx.x;
    if (valid) {
      float loss = 0.0f;
      for (int i = 0; i < kmath::LossTerms::kMaxTerms; ++i) {
        if (pos.target[i] >= 0)
          loss += pos.weight[i] * (lse - kmath::softcap(logit_value(z, pos.target[i]), cap));
      }
      if (losses != nullptr) losses[row] = loss;
    } else {
      if (losses != nullptr) losses[row] = NAN;
      cuda_detail::raise_status(status, cuda_detail::kStatusTargetOutOfRange, row);
    }
  }
  return lse;
}

// d loss / d z_j for the softcapped softmax over the row's terms (the f32 value the store rounds).
__device__ inline float logit_gradient(float zj, int64_t j, const kmath::PositionTerms<float>& pos,
                                       float lse, float cap, float dloss_scale) {
  const float p = expf(kmath::softcap(zj, cap) - lse);
  return dloss_scale * kmath::terms_grad(p, pos.total, kmath::target_weight(pos, j)) *
         kmath::softcap_grad(zj, cap);
}

// Two passes over the row in global memory: one block per row of logits [N, Vp] (f32, or bf16:
// L); the softmax runs over the first V (soft-capped) columns. dlogits may alias logits: every
// read of a row happens before the barrier that precedes the first write.
template <typename L, typename G>
__global__ void cross_entropy_kernel(float* losses, G* dlogits, const L* logits,
                                     const int32_t* targets, int64_t V, int64_t Vp, float cap,
                                     float dloss_scale, kmath::LossTerms terms, int* status) {
  const int64_t row = blockIdx.x;
  const L* z = logits + row * Vp;
  const kmath::PositionTerms<float> pos = kmath::position_terms<float>(terms, targets, row, V);
  const bool valid = targets[row] >= 0 && targets[row] < V && terms_in_range(pos, V);
  kmath::OnlineSoftmax<float> norm;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
    norm.add(kmath::softcap(logit_value(z, j), cap));
  const float lse = row_lse(norm, losses, z, pos, valid, cap, status);
  if (dlogits == nullptr) return;  // uniform across the block: no thread skips a barrier
  __syncthreads();
  G* dz = dlogits + row * Vp;
  for (int64_t j = threadIdx.x; j < Vp; j += blockDim.x) {
    float g = 0.0f;
    if (j < V && valid) g = logit_gradient(logit_value(z, j), j, pos, lse, cap, dloss_scale);
    store_gradient(dz + j, g);
  }
}

// bf16 logits read from HBM once: one block per row copies the row's first V logits into
// shared memory (16-byte loads where the row is aligned so), and both passes (the normaliser,
// kmath::OnlineSoftmax, and the gradient) read them there; d logits are written once. dlogits may
// alias logits: the copy is complete (the barrier below) before the first write.
constexpr int kRowThreads = 1024;

__global__ void __launch_bounds__(kRowThreads)
    cross_entropy_row_in_smem_kernel(float* losses, bf16* dlogits, const bf16* logits,
                                     const int32_t* targets, int64_t V, int64_t Vp, float cap,
                                     float dloss_scale, kmath::LossTerms terms, int* status) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* row_logits = reinterpret_cast<bf16*>(smem_raw);
  const int64_t row = blockIdx.x;
  const bf16* z = logits + row * Vp;
  int64_t copied = 0;
  if (reinterpret_cast<uintptr_t>(z) % 16 == 0) {  // uniform across the block
    const int64_t packs = V / 8;
    const uint4* src = reinterpret_cast<const uint4*>(z);
    uint4* dst = reinterpret_cast<uint4*>(row_logits);
    for (int64_t i = threadIdx.x; i < packs; i += blockDim.x)
      dst[i] = src[i];
    copied = packs * 8;
  }
  for (int64_t j = copied + threadIdx.x; j < V; j += blockDim.x)
    row_logits[j] = z[j];
  __syncthreads();
  const kmath::PositionTerms<float> pos = kmath::position_terms<float>(terms, targets, row, V);
  const bool valid = targets[row] >= 0 && targets[row] < V && terms_in_range(pos, V);
  kmath::OnlineSoftmax<float> norm;
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x)
    norm.add(kmath::softcap(kmath::float_from_bf16(row_logits[j]), cap));
  const float lse = row_lse(norm, losses, row_logits, pos, valid, cap, status);
  if (dlogits == nullptr) return;  // uniform across the block
  bf16* dz = dlogits + row * Vp;
  for (int64_t j = threadIdx.x; j < Vp; j += blockDim.x) {
    float g = 0.0f;
    if (j < V && valid) {
      g = logit_gradient(kmath::float_from_bf16(row_logits[j]), j, pos, lse, cap, dloss_scale);
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

void check_cross_entropy(const std::string& name, int64_t N, int64_t V, int64_t Vp,
                         const kmath::LossTerms& terms) {
  check_sizes(name + ": cross_entropy", {N, V, Vp});
  ENGINE_CHECK(V >= 1 && V <= Vp, name + ": cross_entropy: V = " + std::to_string(V) +
                                      " must be in [1, Vp = " + std::to_string(Vp) + "]");
  ENGINE_CHECK(terms.offsets >= 1 && terms.offsets <= kmath::LossTerms::kMaxOffsets &&
                   terms.row_tokens >= 1 && N % terms.row_tokens == 0,
               name + ": cross_entropy: " + std::to_string(terms.offsets) + " offsets (1.." +
                   std::to_string(kmath::LossTerms::kMaxOffsets) + ") over rows of " +
                   std::to_string(terms.row_tokens) + " of the " + std::to_string(N) +
                   " positions");
}

}  // namespace

bool cuda_detail::classifier_two_pass_forced() {
  static const bool forced = [] {
    const char* env = std::getenv(kClassifierTwoPassEnv);
    return env != nullptr && std::string(env) == "1";
  }();
  return forced;
}

size_t cuda_detail::classifier_row_smem(int64_t V, size_t max_smem_per_block) {
  // The row's V bf16 logits, rounded up to whole 16-byte packs; block_allreduce's static
  // buffer (32 OnlineSoftmax states) shares the block's limit.
  const size_t bytes = (static_cast<size_t>(V) * sizeof(bf16) + 15) / 16 * 16;
  const size_t reduce = 32 * sizeof(kmath::OnlineSoftmax<float>);
  if (classifier_two_pass_forced() || bytes + reduce > max_smem_per_block) return 0;
  return bytes;
}

void CudaBackend::cross_entropy(float* losses, float* dlogits, const float* logits,
                                const int32_t* targets, int64_t N, int64_t V, int64_t Vp,
                                float softcap, float dloss_scale, const kmath::LossTerms& terms) {
  check_cross_entropy(name_, N, V, Vp, terms);
  if (N == 0) return;
  cross_entropy_kernel<<<grid_rows(N, "cross_entropy"), kThreads, 0, stream_>>>(
      losses, dlogits, logits, targets, V, Vp, softcap, dloss_scale, terms, status_);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::cross_entropy(float* losses, bf16* dlogits, const bf16* logits,
                                const int32_t* targets, int64_t N, int64_t V, int64_t Vp,
                                float softcap, float dloss_scale, const kmath::LossTerms& terms) {
  check_cross_entropy(name_, N, V, Vp, terms);
  if (N == 0) return;
  const size_t smem = cuda_detail::classifier_row_smem(V, max_smem_per_block_);
  if (smem == 0) {  // the row does not fit (or ENGINE_CUDA_CLASSIFIER_TWO_PASS=1)
    cross_entropy_kernel<<<grid_rows(N, "cross_entropy"), kThreads, 0, stream_>>>(
        losses, dlogits, logits, targets, V, Vp, softcap, dloss_scale, terms, status_);
    ENGINE_CUDA_LAUNCHED();
    return;
  }
  if (smem > classifier_smem_opted_in_) {  // once per larger row, not per launch
    ENGINE_CUDA_CALL(cudaFuncSetAttribute(cross_entropy_row_in_smem_kernel,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
    classifier_smem_opted_in_ = smem;
  }
  cross_entropy_row_in_smem_kernel<<<grid_rows(N, "cross_entropy"), kRowThreads, smem, stream_>>>(
      losses, dlogits, logits, targets, V, Vp, softcap, dloss_scale, terms, status_);
  ENGINE_CUDA_LAUNCHED();
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
