// The CUDA backend's embedding family (core/ops/embedding.h): the token and position lookup, and
// its backward with the rows of a repeated token added in position order (no atomics).
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

}  // namespace

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
