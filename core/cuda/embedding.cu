// The CUDA backend's embedding family (core/ops/embedding.h): the token and position lookup, and
// its backward with the rows of a repeated token added in position order (no atomics); record
// #89's bigram hash and sign trick and the smear, on kernel_math.h's element math.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "core/check.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_launch.cuh"
#include "core/cuda/cuda_reduce.cuh"
#include "core/kernel_math.h"

namespace core {

using cuda_detail::check_sizes;
using cuda_detail::first_index;
using cuda_detail::grid_for;
using cuda_detail::grid_stride;
using cuda_detail::kThreads;
using cuda_detail::scatter_rows_in_order;

namespace {

// ---- embeddings --------------------------------------------------------------------------------

__device__ inline void store(float* out, float x) {
  *out = x;
}
__device__ inline void store(bf16* out, float x) {
  *out = kmath::bf16_from_float(x);
}

// out f32, or bf16 (bf16 precision's residual stream: the f32 sum rounded once). A block a row
// (token) at a time, its threads over the D columns: the token is read once a row and no
// element divides its index.
template <typename Out>
__global__ void embedding_forward_kernel(Out* out, const int32_t* tokens, const float* wte,
                                         const float* wpe, int64_t T, int64_t D, int64_t rows,
                                         int* status) {
  for (int64_t bt = blockIdx.x; bt < rows; bt += gridDim.x) {
    Out* o = out + bt * D;
    const int32_t token = tokens[bt];
    if (token < 0) {
      if (threadIdx.x == 0)
        cuda_detail::raise_status(status, cuda_detail::kStatusNegativeTokenId, bt);
      for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
        store(o + d, 0.0f);
      continue;
    }
    const float* w = wte + static_cast<int64_t>(token) * D;
    const float* p = wpe != nullptr ? wpe + (bt % T) * D : nullptr;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
      store(o + d, p != nullptr ? w[d] + p[d] : w[d]);
  }
}

// Blocks for `rows` rows of the embedding (each block takes several past the grid's limit).
unsigned embedding_blocks(int64_t rows) {
  return static_cast<unsigned>(std::min<int64_t>(rows, int64_t{1} << 20));
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

// ---- record #89's input side: the bigram hash and sign trick, the smear ----------------------

__global__ void bigram_hash_kernel(int32_t* ids, const int32_t* tokens, int64_t T, int32_t m,
                                   int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    ids[i] = kmath::bigram_hash_at(tokens + (i - i % T), i % T, m);
}

__global__ void bigram_signs_kernel(float* x, const int32_t* tokens, const float* signs, int64_t T,
                                    int64_t D, int64_t sign_rows, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t row = i / D;
    x[i] *= signs[kmath::bigram_sign_row(tokens + (row - row % T), row % T, sign_rows) * D + i % D];
  }
}

// A block a position: the gate's dot over the first K columns reduced in a fixed order, then
// the row.
__global__ void smear_forward_kernel(float* out, float* gate, const float* x, const float* w,
                                     const float* lambda, int64_t T, int64_t D, int64_t K,
                                     int64_t rows) {
  for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
    const float* xi = x + i * D;
    float* o = out + i * D;
    if (i % T == 0) {
      if (threadIdx.x == 0) gate[i] = 0.0f;
      for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
        o[d] = xi[d];
      continue;
    }
    cuda_detail::Sum<float> z;
    for (int64_t k = threadIdx.x; k < K; k += blockDim.x)
      z.value += xi[k] * w[k];
    z = cuda_detail::block_allreduce(z);
    const float s = kmath::sigmoid(z.value), g = lambda[0] * s;
    if (threadIdx.x == 0) gate[i] = s;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
      o[d] = xi[d] + g * xi[d - D];
  }
}

// The backward's per-position terms: dz_t and dg_t s_t (0 at t = 0), a block a position.
__global__ void smear_terms_kernel(float* dz, float* dgs, const float* x, const float* lambda,
                                   const float* gate, const float* dout, int64_t T, int64_t D,
                                   int64_t rows) {
  for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
    if (i % T == 0) {
      if (threadIdx.x == 0) dz[i] = dgs[i] = 0.0f;
      continue;
    }
    cuda_detail::Sum<float> dg;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x)
      dg.value += dout[i * D + d] * x[(i - 1) * D + d];
    dg = cuda_detail::block_allreduce(dg);
    if (threadIdx.x == 0) {
      dz[i] = dg.value * kmath::smear_gate_grad_z(lambda[0], gate[i]);
      dgs[i] = dg.value * gate[i];
    }
  }
}

__global__ void smear_dx_kernel(float* dx, const float* w, const float* lambda, const float* gate,
                                const float* dz, const float* dout, int64_t T, int64_t D, int64_t K,
                                int64_t n) {
  for (int64_t e = first_index(); e < n; e += grid_stride()) {
    const int64_t i = e / D, d = e % D;
    float v = dout[e];
    if ((i + 1) % T != 0) v += lambda[0] * gate[i + 1] * dout[e + D];
    if (d < K) v += dz[i] * w[d];
    dx[e] = v;
  }
}

// dw[k] += sum_t dz_t x[t, k] and dlambda += sum_t dg_t s_t as column sums.
struct SmearWeightTerms {
  static constexpr int kCount = 1;
  const float* dz;
  const float* x;
  int64_t D;
  __device__ void operator()(int64_t r, int64_t c, int64_t, float* v) const {
    v[0] = dz[r] * x[r * D + c];
  }
};
struct SmearLambdaTerms {
  static constexpr int kCount = 1;
  const float* dgs;
  __device__ void operator()(int64_t r, int64_t, int64_t, float* v) const { v[0] = dgs[r]; }
};

}  // namespace

void CudaBackend::bigram_hash(int32_t* ids, const int32_t* tokens, int64_t B, int64_t T,
                              int64_t table_rows) {
  check_sizes(name_ + ": bigram_hash", {B, T});
  ENGINE_CHECK(
      table_rows >= 2 && table_rows - 1 <= INT32_MAX,
      name_ + ": bigram_hash: table_rows must be in [2, 2^31], got " + std::to_string(table_rows));
  if (B * T == 0) return;
  bigram_hash_kernel<<<grid_for(B * T), kThreads, 0, stream_>>>(
      ids, tokens, T, static_cast<int32_t>(table_rows - 1), B * T);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::bigram_signs(float* x, const int32_t* tokens, const float* signs, int64_t B,
                               int64_t T, int64_t D, int64_t sign_rows) {
  check_sizes(name_ + ": bigram_signs", {B, T, D});
  ENGINE_CHECK(sign_rows >= 1, name_ + ": bigram_signs: no sign rows");
  if (B * T * D == 0) return;
  bigram_signs_kernel<<<grid_for(B * T * D), kThreads, 0, stream_>>>(x, tokens, signs, T, D,
                                                                     sign_rows, B * T * D);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::smear_forward(float* out, float* gate, const float* x, const float* w,
                                const float* lambda, int64_t B, int64_t T, int64_t D, int64_t K) {
  check_sizes(name_ + ": smear_forward", {B, T, D, K});
  ENGINE_CHECK(K <= D, name_ + ": smear_forward: gate width " + std::to_string(K) +
                           " exceeds the row's " + std::to_string(D));
  if (B * T * D == 0) return;
  smear_forward_kernel<<<embedding_blocks(B * T), kThreads, 0, stream_>>>(out, gate, x, w, lambda,
                                                                          T, D, K, B * T);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::smear_backward(float* dx, float* dw, float* dlambda, const float* x,
                                 const float* w, const float* lambda, const float* gate,
                                 const float* dout, int64_t B, int64_t T, int64_t D, int64_t K) {
  check_sizes(name_ + ": smear_backward", {B, T, D, K});
  const int64_t N = B * T;
  if (N * D == 0) return;
  cuda_detail::DeviceBuffer<float> terms(allocator_, 2 * N);
  float* dz = terms.get();
  float* dgs = terms.get() + N;
  smear_terms_kernel<<<embedding_blocks(N), kThreads, 0, stream_>>>(dz, dgs, x, lambda, gate, dout,
                                                                    T, D, N);
  ENGINE_CUDA_LAUNCHED();
  cuda_detail::column_sums(allocator_, stream_, cuda_detail::ColumnTargets{{dw, nullptr}},
                           SmearWeightTerms{dz, x, D}, N, K, "smear_backward");
  cuda_detail::column_sums(allocator_, stream_, cuda_detail::ColumnTargets{{dlambda, nullptr}},
                           SmearLambdaTerms{dgs}, N, 1, "smear_backward");
  smear_dx_kernel<<<grid_for(N * D), kThreads, 0, stream_>>>(dx, w, lambda, gate, dz, dout, T, D, K,
                                                             N * D);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::embedding_forward(float* out, const int32_t* tokens, const float* wte,
                                    const float* wpe, int64_t B, int64_t T, int64_t D) {
  check_sizes(name_ + ": embedding_forward", {B, T, D});
  if (B * T * D == 0) return;
  embedding_forward_kernel<<<embedding_blocks(B * T), kThreads, 0, stream_>>>(out, tokens, wte, wpe,
                                                                              T, D, B * T, status_);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::embedding_forward(bf16* out, const int32_t* tokens, const float* wte,
                                    const float* wpe, int64_t B, int64_t T, int64_t D) {
  check_sizes(name_ + ": embedding_forward", {B, T, D});
  if (B * T * D == 0) return;
  embedding_forward_kernel<<<embedding_blocks(B * T), kThreads, 0, stream_>>>(out, tokens, wte, wpe,
                                                                              T, D, B * T, status_);
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

}  // namespace core
