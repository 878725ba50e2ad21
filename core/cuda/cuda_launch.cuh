// Internal helpers of the CUDA backend: launch geometry, launch checking, scratch buffers and
// warp- and block-wide reductions over any mergeable state (sums, online softmax).
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/check.h"
#include "core/cuda/cuda_check.h"

namespace core::cuda_detail {

constexpr int kThreads = 256;          // threads per block of elementwise and row kernels
constexpr int64_t kMaxBlocks = 65536;  // grid-stride loops cover the rest
constexpr int64_t kMaxGridY = 65535;   // the grid's y (and z) limit

// The grid-stride loop of a 1-D launch: this thread's first index, and the step to its next.
__device__ inline int64_t first_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t grid_stride() {
  return static_cast<int64_t>(blockDim.x) * gridDim.x;
}

// Blocks for a grid-stride loop over n elements.
inline unsigned grid_for(int64_t n) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// Rows are one block each, so a row count must fit the grid's x dimension.
inline unsigned grid_rows(int64_t rows, const char* op) {
  ENGINE_CHECK(rows <= INT_MAX,
               std::string(op) + ": " + std::to_string(rows) + " rows exceed one launch");
  return static_cast<unsigned>(rows);
}

// ---- vector access -------------------------------------------------------------------------
//
// Memory-bound kernels move W consecutive floats at a time: W = 4 is one 16-byte load or store
// (ld.global.v4), four times fewer memory instructions than floats one by one. A kernel takes W
// as a template argument and its launcher picks it with pack_width.

template <int W>
struct alignas(sizeof(float) * W) FloatPack {
  float v[W];
};

template <int W>
__device__ inline FloatPack<W> load_pack(const float* p) {
  return *reinterpret_cast<const FloatPack<W>*>(p);
}
template <int W>
__device__ inline void store_pack(float* p, const FloatPack<W>& x) {
  *reinterpret_cast<FloatPack<W>*>(p) = x;
}

// a += b, lane by lane.
template <int W>
__device__ inline void add_pack(FloatPack<W>& a, const FloatPack<W>& b) {
#pragma unroll
  for (int i = 0; i < W; ++i)
    a.v[i] += b.v[i];
}

// 4 when every run of `multiple_of` floats the kernel moves at these pointers can go in 16-byte
// packs (`multiple_of` divisible by 4, each pointer on a 16-byte boundary; null pointers are not
// read), else 1.
inline int pack_width(int64_t multiple_of, std::initializer_list<const void*> pointers) {
  if (multiple_of % 4 != 0) return 1;
  for (const void* p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % (4 * sizeof(float)) != 0) return 1;
  return 4;
}

// Multi-tensor launches: entries (tensors, matrices) own consecutive runs of a grid's blocks,
// first_block(i) the first of entry i's run, in entry order. Returns the entry block b works
// for: the last whose run starts at or before b (an entry with an empty run is never chosen).
template <typename FirstBlock>
__device__ inline int owner_of_block(int64_t b, int count, FirstBlock first_block) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first_block(mid) <= b) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// A tensor of a multi-tensor launch over chunks of equal length: its data, its length and the
// index of its first chunk among all the tensors' chunks (a block per chunk; owner_of_block
// finds the tensor).
template <typename T>
struct ChunkedSpan {
  T* x;
  int64_t n;
  int64_t first_chunk;
};

// What block blockIdx.x of a launch over a chunk table (chunks of `chunk` elements) works on:
// its tensor and the element range [begin, end) of its chunk.
template <typename T>
struct BlockChunk {
  ChunkedSpan<T> t;
  int64_t begin;
  int64_t end;
};
template <typename T>
__device__ inline BlockChunk<T> chunk_of_block(const ChunkedSpan<T>* table, int count,
                                               int64_t chunk) {
  const int64_t b = blockIdx.x;
  const ChunkedSpan<T> t =
      table[owner_of_block(b, count, [table](int i) { return table[i].first_chunk; })];
  const int64_t begin = (b - t.first_chunk) * chunk;
  return {t, begin, begin + chunk < t.n ? begin + chunk : t.n};
}

// The table of the non-empty tensors of xs in chunks of `chunk` elements; returns the chunks in
// all, which must fit one launch (`op` names the caller otherwise).
template <typename T>
int64_t chunk_table(std::span<const std::span<T>> xs, int64_t chunk,
                    std::vector<ChunkedSpan<T>>& table, const std::string& op) {
  table.clear();
  int64_t chunks = 0;
  for (std::span<T> x : xs) {
    const int64_t n = static_cast<int64_t>(x.size());
    if (n == 0) continue;
    table.push_back({x.data(), n, chunks});
    chunks += (n + chunk - 1) / chunk;
  }
  ENGINE_CHECK(chunks <= INT_MAX && table.size() <= INT_MAX,
               op + ": " + std::to_string(chunks) + " chunks exceed one launch");
  return chunks;
}

// cuBLAS and cuSOLVER take int sizes.
inline int to_int(int64_t value, const char* what, const char* op) {
  ENGINE_CHECK(value >= 0 && value <= INT_MAX, std::string(op) + ": " + what + " = " +
                                                   std::to_string(value) +
                                                   " is outside the int range of the library");
  return static_cast<int>(value);
}

// A launch error (bad configuration, missing kernel image for this GPU) shows up here.
#define ENGINE_CUDA_LAUNCHED() ENGINE_CUDA_CALL(cudaGetLastError())

// Scratch memory from the backend's caching allocator, returned to the cache on scope exit.
// Reuse is safe while kernels still run: all of the backend's work is in one stream's order.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer(Allocator& allocator, int64_t count)
      : allocator_(allocator), bytes_(static_cast<size_t>(count) * sizeof(T)) {
    ptr_ = static_cast<T*>(allocator_.allocate(bytes_));
  }
  ~DeviceBuffer() { allocator_.deallocate(ptr_, bytes_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  T* get() const { return ptr_; }

 private:
  Allocator& allocator_;
  size_t bytes_;
  T* ptr_ = nullptr;
};

// out [batch, cols, rows] = transpose of each in [rows, cols], the inputs `in_stride` elements
// apart (linalg.cu).
void transpose_batched(float* out, const float* in, int64_t batch, int64_t rows, int64_t cols,
                       int64_t in_stride, cudaStream_t stream);

// Raises kStatusNonFiniteInput (detail: the batch member) when a [batch, size] input holds a
// NaN or infinity (linalg.cu).
void flag_non_finite(const float* a, int64_t size, int64_t batch, int* status, cudaStream_t stream);

// Codes a kernel can raise in the backend's device status word {code, detail}; the first one
// wins and CudaBackend::synchronize() reports it.
constexpr int kStatusOk = 0;
constexpr int kStatusTargetOutOfRange = 1;  // cross_entropy; detail: the row
constexpr int kStatusNegativeTokenId = 2;   // embedding; detail: the position in tokens
constexpr int kStatusNegativeRowIndex = 3;  // gather/scatter rows; detail: the position in index
constexpr int kStatusNonFiniteInput = 4;    // qr, eigh, svd; detail: the batch member
constexpr int kStatusColumnIndexOutOfRange = 5;  // gather_columns; detail: the position in index

__device__ inline void raise_status(int* status, int code, int64_t detail) {
  if (atomicCAS(status, kStatusOk, code) == kStatusOk) {
    status[1] = static_cast<int>(detail < INT_MAX ? detail : INT_MAX);
  }
}

// ---- reductions ----------------------------------------------------------------------------

// A plain sum as a mergeable state.
template <typename T>
struct Sum {
  T value = T(0);
  __device__ void merge(const Sum& o) { value += o.value; }
};

// Two sums reduced together.
template <typename T>
struct Sum2 {
  T a = T(0);
  T b = T(0);
  __device__ void merge(const Sum2& o) {
    a += o.a;
    b += o.b;
  }
};

// Shuffles a trivially copyable state word by word.
template <typename S>
__device__ S shfl_xor(const S& v, int mask) {
  static_assert(sizeof(S) % sizeof(int) == 0, "state must be a whole number of ints");
  constexpr int kWords = sizeof(S) / sizeof(int);
  int words[kWords];
  memcpy(words, &v, sizeof(S));
#pragma unroll
  for (int i = 0; i < kWords; ++i)
    words[i] = __shfl_xor_sync(0xffffffffu, words[i], mask);
  S out;
  memcpy(&out, words, sizeof(S));
  return out;
}

// The max and the sum of a value over the kLanes threads sharing it (aligned groups of lanes:
// a half-warp, or the whole warp); every one of them gets the same bits (a butterfly, and
// a + b == b + a bit for bit). All 32 lanes of the warp must call it.
template <int kLanes = 16>
__device__ inline float row_group_max(float v) {
#pragma unroll
  for (int mask = kLanes / 2; mask > 0; mask >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, mask));
  return v;
}
template <int kLanes = 16>
__device__ inline float row_group_sum(float v) {
#pragma unroll
  for (int mask = kLanes / 2; mask > 0; mask >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, mask);
  return v;
}

// Reduces one state per thread over the whole block; every thread returns the same result
// (lane 0 of each warp publishes, then all threads merge the warp results in warp order, so the
// result is deterministic). blockDim.x must be a multiple of 32; all threads must call it.
template <typename S>
__device__ S block_allreduce(S v) {
  __shared__ alignas(16) unsigned char raw[32 * sizeof(S)];
  S* warp_state = reinterpret_cast<S*>(raw);
  for (int mask = 16; mask > 0; mask >>= 1)
    v.merge(shfl_xor(v, mask));
  int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) warp_state[warp] = v;
  __syncthreads();
  S total = warp_state[0];
  int warps = blockDim.x / 32;
  for (int w = 1; w < warps; ++w)
    total.merge(warp_state[w]);
  __syncthreads();  // the buffer may be reused by the next reduction of this kernel
  return total;
}

}  // namespace core::cuda_detail
