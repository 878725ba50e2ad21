// Internal reductions of the CUDA backend shared by several op families: fixed-order column sums
// (bias and LayerNorm parameter gradients), rows scattered in order (embedding and MoE backward),
// and the size check of the launchers. Deterministic: no atomics anywhere.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/allocator.h"
#include "core/check.h"
#include "core/cuda/cuda_launch.cuh"

namespace core::cuda_detail {

inline void check_sizes(const std::string& where, std::initializer_list<int64_t> sizes) {
  for (int64_t s : sizes)
    ENGINE_CHECK(s >= 0, where + ": negative size " + std::to_string(s));
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

// dst[index[i], :] += src[i, :] * weight[i] without atomics: a stable radix sort of the
// positions by destination groups the rows, then each destination row is summed in position
// order (as llm.c's deterministic embedding backward). A negative index raises negative_code
// (moe.cu).
void scatter_rows_in_order(Allocator& allocator, cudaStream_t stream, float* dst, const float* src,
                           const int32_t* index, const float* weight, int64_t n, int64_t D,
                           int negative_code, int* status, const char* op);

}  // namespace core::cuda_detail
