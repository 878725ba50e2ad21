// The tiles the CUDA attention kernels share: attention.cu's flash kernels on FMA units and
// attention_mma.cu's on tensor cores. Both cut a head into tiles of kTile queries by kTile
// keys, keep operand tiles row-major in shared memory (LD floats a row) with the head dimension
// padded with zeros to HD (32, 64 or 128), and launch one block per (head, tile).
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

#include "core/check.h"
#include "core/cuda/cuda_check.h"
#include "core/kernel_math.h"
#include "core/ops/attention.h"

namespace core::cuda_detail {

constexpr int kTile = 64;

// A value as the kernels store it: f32 as computed, or bf16 (bf16 precision's attention output
// and gradients) rounded once; and a stored value as they compute with it (bf16 widened exactly).
template <typename Out>
__device__ inline Out stored_as(float x) {
  if constexpr (std::is_same_v<Out, bf16>) {
    return kmath::bf16_from_float(x);
  } else {
    static_assert(std::is_same_v<Out, float>, "attention stores f32 or bf16");
    return x;
  }
}
__device__ inline float loaded(float x) {
  return x;
}
__device__ inline float loaded(bf16 x) {
  return kmath::float_from_bf16(x);
}

// Rows [row0, row0 + kTile) of a head's [T, hd] rows (row stride ld) into a [kTile, LD] shared
// tile; rows past T and columns past hd (up to HD) read as zero. Unpadded rows on a 16-byte
// boundary (hd = HD, a multiple of 4, ld too) move in 16-byte loads, and stores too where LD
// keeps them aligned.
template <int HD, int LD>
__device__ inline void load_rows(float* dst, const float* src, int64_t row0, int64_t T, int64_t hd,
                                 int64_t ld) {
  if (hd == HD && ld % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    constexpr int kPacks = HD / 4;  // per row
    for (int idx = threadIdx.x; idx < kTile * kPacks; idx += blockDim.x) {
      const int r = idx / kPacks, d = 4 * (idx % kPacks);
      const int64_t row = row0 + r;
      const float4 v = row < T ? *reinterpret_cast<const float4*>(src + row * ld + d)
                               : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      float* out = dst + r * LD + d;
      if constexpr (LD % 4 == 0) {
        *reinterpret_cast<float4*>(out) = v;
      } else {
        out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
      }
    }
    return;
  }
  for (int idx = threadIdx.x; idx < kTile * HD; idx += blockDim.x) {
    const int r = idx / HD, d = idx % HD;
    const int64_t row = row0 + r;
    dst[r * LD + d] = row < T && d < hd ? src[row * ld + d] : 0.0f;
  }
}

// The key and value rows [c0, c0 + kTile) of a head (row strides ldk, ldv) into shared memory,
// once every thread is done with the previous tile (and with what it computed from it); visible
// to all on return.
template <int HD, int LD>
__device__ inline void next_key_tile(float* sk, float* sv, const float* k, const float* v,
                                     int64_t c0, int64_t T, int64_t hd, int64_t ldk, int64_t ldv) {
  __syncthreads();
  load_rows<HD, LD>(sk, k, c0, T, hd, ldk);
  load_rows<HD, LD>(sv, v, c0, T, hd, ldv);
  __syncthreads();
}

// Rows [row0, row0 + kTile) of a per-row statistic (lse or delta), zero past T.
__device__ inline void load_stat(float* dst, const float* src, int64_t row0, int64_t T) {
  for (int r = threadIdx.x; r < kTile; r += blockDim.x)
    dst[r] = row0 + r < T ? src[row0 + r] : 0.0f;
}

// What the backward kernels read of the query tile from r0 (a head's tensors and statistics):
// q and dout rows (row strides ldq, ldo), lse and delta. No barrier: the caller orders it with
// its other uses.
template <int HD, int LD>
__device__ inline void load_query_tile(float* sq, float* sg, float* slse, float* sdelta,
                                       const float* q, const float* dout, const float* lse,
                                       const float* delta, int64_t r0, int64_t T, int64_t hd,
                                       int64_t ldq, int64_t ldo) {
  load_rows<HD, LD>(sq, q, r0, T, hd, ldq);
  load_rows<HD, LD>(sg, dout, r0, T, hd, ldo);
  load_stat(slse, lse, r0, T);
  load_stat(sdelta, delta, r0, T);
}

// The mask's key_begin row of a head (null without a mask), and the begin of query i (0 past T).
__device__ inline const int32_t* head_begins(const AttentionMask& mask, int64_t head, int64_t T) {
  return mask.key_begin ? mask.key_begin + (head / mask.heads) * T : nullptr;
}
__device__ inline int64_t begin_of(const int32_t* begins, int64_t i, int64_t T) {
  return begins && i < T ? begins[i] : 0;
}
// The begin of the last real row of the query tile from r0.
__device__ inline int64_t last_begin(const int32_t* begins, int64_t r0, int64_t T) {
  return begin_of(begins, (r0 + kTile < T ? r0 + kTile : T) - 1, T);
}

// The query tile of a block of the forward or of the dq backward: the last tile first. Under the
// causal mask a later tile visits more key tiles, and blocks start in the order of their index
// (heads fastest), so the longest start first and the short ones fill in at the end, where the
// other order leaves a tail of long blocks on a few SMs. (The dk, dv backward's key tile 0 has
// the most query tiles to visit: its natural order is already the heaviest first.)
__device__ inline int64_t heaviest_first_query_tile() {
  return static_cast<int64_t>(gridDim.y) - 1 - static_cast<int64_t>(blockIdx.y);
}

// Lets `kernel` take `smem` bytes of dynamic shared memory on this thread's device: one driver
// call per kernel and device at the largest size asked, not one per launch.
inline void allow_dynamic_smem(const void* kernel, size_t smem) {
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, size_t> allowed;
  int device = 0;
  ENGINE_CUDA_CALL(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  size_t& now = allowed[{device, kernel}];
  if (smem <= now) return;
  ENGINE_CUDA_CALL(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  now = smem;
}

// Launches `kernel` on a (BH, tiles of T) grid of `threads`-thread blocks with `smem` bytes of
// dynamic shared memory.
template <typename Kernel, typename... Args>
void launch_tiles(Kernel kernel, size_t smem, int threads, int64_t BH, int64_t T,
                  cudaStream_t stream, Args... args) {
  allow_dynamic_smem(reinterpret_cast<const void*>(kernel), smem);
  const dim3 grid(static_cast<unsigned>(BH), static_cast<unsigned>((T + kTile - 1) / kTile));
  kernel<<<grid, threads, smem, stream>>>(args...);
  ENGINE_CUDA_CALL(cudaGetLastError());
}

// The padded head dimension the kernels are instantiated for: 32, 64 or 128 (128 past it too:
// padded_head_dim refuses those by name).
constexpr int tile_head_dim(int64_t hd) {
  return hd <= 32 ? 32 : hd <= 64 ? 64 : 128;
}
inline int padded_head_dim(int64_t hd, const std::string& op) {
  ENGINE_CHECK(hd >= 1 && hd <= 128, op + ": head dimension " + std::to_string(hd) +
                                         " is outside the [1, 128] the attention kernels cover");
  return tile_head_dim(hd);
}

// Returns f(std::integral_constant<int, HD>{}) for the padded head dimension HD (32, 64 or 128):
// the kernels' template argument from the runtime value.
template <typename F>
decltype(auto) with_head_dim(int padded_hd, F f) {
  switch (padded_hd) {
    case 32:
      return f(std::integral_constant<int, 32>{});
    case 64:
      return f(std::integral_constant<int, 64>{});
    default:
      return f(std::integral_constant<int, 128>{});
  }
}

// The grid's limits: BH in x, the tiles of T in y.
inline void check_attention_grid(int64_t BH, int64_t T, const std::string& op) {
  ENGINE_CHECK(BH <= INT_MAX && (T + kTile - 1) / kTile <= 65535,
               op + ": " + std::to_string(BH) + " heads of length " + std::to_string(T) +
                   " exceed one launch");
}

// What the tile products of the tensor-core flash kernels take: TF32 operands (mma.sync
// m16n8k8), or bf16 ones (m16n8k16: twice the rate and half the k steps; q, k, v, dout and the
// probabilities rounded to bf16 as they enter a product, as llm.c's and cuDNN's bf16 attention
// hold them). Either accumulates in f32; the softmax, its log-sum-exp and the masks are f32.
enum class MmaOperands { kTf32, kBf16 };

// Flash attention on tensor cores (attention_mma.cu; sm_80 and later), the contract of the
// backend's attention_forward and attention_backward for head dimensions padded to HD:
// forward writes out and lse; backward writes dq, dk, dv from delta = rowsum(dout out); every
// tensor where the (resolved) layout puts it. Out and G: float, or bf16 (each stored value the
// f32 one rounded once).
template <typename Out>
void flash_forward_mma(MmaOperands operands, int HD, Out* out, float* lse, const float* q,
                       const float* k, const float* v, int64_t BH, int64_t T, int64_t hd,
                       float scale, const AttentionMask& mask, const AttentionLayout& layout,
                       cudaStream_t stream);
template <typename G>
void flash_backward_mma(MmaOperands operands, int HD, G* dq, G* dk, G* dv, const float* dout,
                        const float* lse, const float* delta, const float* q, const float* k,
                        const float* v, int64_t BH, int64_t T, int64_t hd, float scale,
                        const AttentionMask& mask, const AttentionLayout& layout,
                        cudaStream_t stream);

}  // namespace core::cuda_detail
