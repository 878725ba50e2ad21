// The CUDA backend's MoE family (core/ops/moe.h): top-k routing, the router backward, and the row
// gather/scatter of the dispatch; scattered rows are added in order (no atomics).
#include <cuda_runtime.h>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <climits>
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
using cuda_detail::scatter_rows_in_order;
using cuda_detail::Sum;
using cuda_detail::Sum2;

namespace {

__global__ void iota_kernel(int32_t* out, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    out[i] = static_cast<int32_t>(i);
}

// One block per sorted position; the block at the first position of a destination row adds that
// row's sources in position order (order[] is ascending within a group), so the sum has the
// CPU's order and does not depend on scheduling. The other blocks return at once.
__global__ void scatter_sorted_rows_kernel(float* dst, const float* src, const int32_t* sorted_to,
                                           const int32_t* order, const float* weight, int64_t n,
                                           int64_t D, int negative_code, int* status) {
  const int64_t i = blockIdx.x;
  const int32_t to = sorted_to[i];
  if (i > 0 && sorted_to[i - 1] == to) return;
  if (to < 0) {
    if (threadIdx.x == 0) cuda_detail::raise_status(status, negative_code, order[i]);
    return;
  }
  float* out = dst + static_cast<int64_t>(to) * D;
  for (int64_t c = threadIdx.x; c < D; c += blockDim.x) {
    float acc = out[c];
    for (int64_t j = i; j < n && sorted_to[j] == to; ++j) {
      const int64_t r = order[j];
      acc += src[r * D + c] * (weight != nullptr ? weight[r] : 1.0f);
    }
    out[c] = acc;
  }
}

// ---- row gather / scatter ----------------------------------------------------------------------

__global__ void gather_rows_kernel(float* out, const float* src, const int32_t* index,
                                   const float* weight, int64_t D, int64_t total, int* status) {
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t r = i / D;
    const int32_t from = index[r];
    if (from < 0) {
      cuda_detail::raise_status(status, cuda_detail::kStatusNegativeRowIndex, r);
      out[i] = 0.0f;
      continue;
    }
    const float w = weight != nullptr ? weight[r] : 1.0f;
    out[i] = src[static_cast<int64_t>(from) * D + i % D] * w;
  }
}

// bf16 rows (bf16 precision's stored activations), copied.
__global__ void gather_bf16_rows_kernel(bf16* out, const bf16* src, const int32_t* index, int64_t D,
                                        int64_t total, int* status) {
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t r = i / D;
    const int32_t from = index[r];
    if (from < 0) {
      cuda_detail::raise_status(status, cuda_detail::kStatusNegativeRowIndex, r);
      out[i] = bf16{};
      continue;
    }
    out[i] = src[static_cast<int64_t>(from) * D + i % D];
  }
}

// One thread per element of out: token t's K dispatch rows taken in ascending order by repeated
// minimum (K is small), summed from the widened base in f32, rounded once (combine_rows).
__global__ void combine_rows_kernel(bf16* out, const bf16* base, const float* rows,
                                    const int32_t* slot_row, const float* gate, int64_t K,
                                    int64_t D, int64_t total, int* status) {
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t t = i / D, c = i % D;
    const int32_t* slots = slot_row + t * K;
    float v = kmath::float_from_bf16(base[i]);
    int32_t last = -1;
    for (int64_t k = 0; k < K; ++k) {
      int32_t next = INT32_MAX;
      for (int64_t j = 0; j < K; ++j)
        if (slots[j] > last && slots[j] < next) next = slots[j];
      if (next == INT32_MAX) {  // a negative or repeated row: report the first negative slot
        int64_t bad = 0;
        while (bad < K - 1 && slots[bad] >= 0)
          ++bad;
        cuda_detail::raise_status(status, cuda_detail::kStatusNegativeRowIndex, t * K + bad);
        break;
      }
      v += rows[static_cast<int64_t>(next) * D + c] * gate[next];
      last = next;
    }
    out[i] = kmath::bf16_from_float(v);
  }
}

__global__ void row_dot_kernel(float* out, const float* a, const float* b, int64_t D) {
  const int64_t row = blockIdx.x;
  Sum<float> s;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
    s.value += a[row * D + j] * b[row * D + j];
  s = block_allreduce(s);
  if (threadIdx.x == 0) out[row] = s.value;
}

// One thread per token.
__global__ void moe_top_k_kernel(int32_t* chosen, float* sel_sum, const float* probs, int64_t N,
                                 int64_t E, int64_t K) {
  for (int64_t t = first_index(); t < N; t += grid_stride())
    sel_sum[t] = kmath::moe_top_k(probs + t * E, E, K, chosen + t * K);
}

// One block per expert: how many tokens chose it (into offset[e + 1], made a prefix sum by
// moe_route_finish_kernel) and the float64 sum of its probability over the tokens.
__global__ void moe_expert_stats_kernel(int32_t* offset, double* mass, const int32_t* chosen,
                                        const float* probs, int64_t N, int64_t E, int64_t K) {
  const int32_t e = static_cast<int32_t>(blockIdx.x);
  Sum2<double> s;  // a: count (exact in float64), b: probability mass
  for (int64_t t = threadIdx.x; t < N; t += blockDim.x) {
    for (int64_t j = 0; j < K; ++j)
      s.a += chosen[t * K + j] == e ? 1.0 : 0.0;
    s.b += probs[t * E + e];
  }
  s = block_allreduce(s);
  if (threadIdx.x == 0) {
    offset[e + 1] = static_cast<int32_t>(s.a);
    mass[e] = s.b;
  }
}

// One thread: expert offsets, fractions f_e and the aux loss, experts in order.
__global__ void moe_route_finish_kernel(int32_t* offset, float* frac, float* aux_loss,
                                        const double* mass, int64_t N, int64_t E,
                                        float aux_weight) {
  offset[0] = 0;
  double balance = 0.0;
  for (int64_t e = 0; e < E; ++e) {
    const int32_t count = offset[e + 1];
    frac[e] = kmath::moe_fraction<float>(count, N);
    balance += kmath::moe_balance_term(frac[e], mass[e], N);
    offset[e + 1] = offset[e] + count;
  }
  aux_loss[0] += kmath::moe_aux_loss(aux_weight, E, balance);
}

// One block per expert: its rows in token order, numbered by a block-wide prefix count over
// the tokens that chose it (a token chooses an expert at most once).
__global__ void moe_dispatch_kernel(MoeRouting r, const float* probs, int64_t N, int64_t E,
                                    int64_t K) {
  using Scan = cub::BlockScan<int, kThreads>;
  __shared__ typename Scan::TempStorage scan_storage;
  const int32_t e = static_cast<int32_t>(blockIdx.x);
  int next_row = r.offset[e];
  for (int64_t t0 = 0; t0 < N; t0 += kThreads) {
    const int64_t t = t0 + threadIdx.x;
    int64_t slot = -1;
    if (t < N) {
      for (int64_t j = 0; j < K; ++j)
        if (r.chosen[t * K + j] == e) slot = j;
    }
    int before = 0, chunk_total = 0;
    Scan(scan_storage).ExclusiveSum(slot >= 0 ? 1 : 0, before, chunk_total);
    if (slot >= 0) {
      const int row = next_row + before;
      r.slot_row[t * K + slot] = row;
      r.row_token[row] = static_cast<int32_t>(t);
      r.row_gate[row] = kmath::moe_gate(probs[t * E + e], r.sel_sum[t]);
    }
    next_row += chunk_total;
    __syncthreads();  // scan_storage is reused by the next chunk
  }
}

// One thread per token.
__global__ void moe_router_backward_kernel(float* dprobs, MoeRouting r, const float* dgate,
                                           int64_t N, int64_t E, int64_t K, float aux_scale) {
  for (int64_t t = first_index(); t < N; t += grid_stride())
    kmath::moe_router_grad(dprobs + t * E, r.frac, aux_scale, E, r.chosen + t * K,
                           r.slot_row + t * K, dgate, r.row_gate, r.sel_sum[t], K);
}

void check_moe_sizes(const std::string& where, int64_t N, int64_t E, int64_t K) {
  ENGINE_CHECK(N > 0 && K >= 1 && K <= E && E <= INT32_MAX && N * K <= INT32_MAX,
               where + ": need N > 0 tokens and 1 <= K <= E experts (rows fit int32), got N=" +
                   std::to_string(N) + " E=" + std::to_string(E) + " K=" + std::to_string(K));
}

}  // namespace

void cuda_detail::scatter_rows_in_order(Allocator& allocator, cudaStream_t stream, float* dst,
                                        const float* src, const int32_t* index, const float* weight,
                                        int64_t n, int64_t D, int negative_code, int* status,
                                        const char* op) {
  const int count = cuda_detail::to_int(n, "rows", op);
  DeviceBuffer<int32_t> sorted_to(allocator, n), positions(allocator, n), order(allocator, n);
  iota_kernel<<<grid_for(n), kThreads, 0, stream>>>(positions.get(), n);
  ENGINE_CUDA_LAUNCHED();
  size_t temp_bytes = 0;
  ENGINE_CUDA_CALL(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, index, sorted_to.get(),
                                                   positions.get(), order.get(), count, 0,
                                                   int(8 * sizeof(int32_t)), stream));
  DeviceBuffer<unsigned char> temp(allocator,
                                   static_cast<int64_t>(std::max<size_t>(temp_bytes, 1)));
  ENGINE_CUDA_CALL(cub::DeviceRadixSort::SortPairs(temp.get(), temp_bytes, index, sorted_to.get(),
                                                   positions.get(), order.get(), count, 0,
                                                   int(8 * sizeof(int32_t)), stream));
  scatter_sorted_rows_kernel<<<grid_rows(n, op), kThreads, 0, stream>>>(
      dst, src, sorted_to.get(), order.get(), weight, n, D, negative_code, status);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::gather_rows(float* out, const float* src, const int32_t* index,
                              const float* weight, int64_t n, int64_t D) {
  check_sizes(name_ + ": gather_rows", {n, D});
  const int64_t total = n * D;
  if (total == 0) return;
  gather_rows_kernel<<<grid_for(total), kThreads, 0, stream_>>>(out, src, index, weight, D, total,
                                                                status_);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::gather_rows(bf16* out, const bf16* src, const int32_t* index, int64_t n,
                              int64_t D) {
  check_sizes(name_ + ": gather_rows", {n, D});
  const int64_t total = n * D;
  if (total == 0) return;
  gather_bf16_rows_kernel<<<grid_for(total), kThreads, 0, stream_>>>(out, src, index, D, total,
                                                                     status_);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::scatter_add_rows(float* dst, const float* src, const int32_t* index,
                                   const float* weight, int64_t n, int64_t D) {
  check_sizes(name_ + ": scatter_add_rows", {n, D});
  const int64_t total = n * D;
  if (total == 0) return;
  scatter_rows_in_order(allocator_, stream_, dst, src, index, weight, n, D,
                        cuda_detail::kStatusNegativeRowIndex, status_, "scatter_add_rows");
}

void CudaBackend::combine_rows(bf16* out, const bf16* base, const float* rows,
                               const int32_t* slot_row, const float* gate, int64_t N, int64_t K,
                               int64_t D) {
  check_sizes(name_ + ": combine_rows", {N, K, D});
  const int64_t total = N * D;
  if (total == 0) return;
  combine_rows_kernel<<<grid_for(total), kThreads, 0, stream_>>>(out, base, rows, slot_row, gate, K,
                                                                 D, total, status_);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::row_dot(float* out, const float* a, const float* b, int64_t n, int64_t D) {
  check_sizes(name_ + ": row_dot", {n, D});
  if (n == 0) return;
  row_dot_kernel<<<grid_rows(n, "row_dot"), kThreads, 0, stream_>>>(out, a, b, D);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::moe_route(const MoeRouting& r, float* aux_loss, const float* probs, int64_t N,
                            int64_t E, int64_t K, float aux_weight) {
  check_moe_sizes(name_ + ": moe_route", N, E, K);
  const unsigned experts = grid_rows(E, "moe_route");
  moe_top_k_kernel<<<grid_for(N), kThreads, 0, stream_>>>(r.chosen, r.sel_sum, probs, N, E, K);
  ENGINE_CUDA_LAUNCHED();
  moe_expert_stats_kernel<<<experts, kThreads, 0, stream_>>>(r.offset, r.mass, r.chosen, probs, N,
                                                             E, K);
  ENGINE_CUDA_LAUNCHED();
  moe_route_finish_kernel<<<1, 1, 0, stream_>>>(r.offset, r.frac, aux_loss, r.mass, N, E,
                                                aux_weight);
  ENGINE_CUDA_LAUNCHED();
  moe_dispatch_kernel<<<experts, kThreads, 0, stream_>>>(r, probs, N, E, K);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::moe_router_backward(float* dprobs, const MoeRouting& r, const float* dgate,
                                      int64_t N, int64_t E, int64_t K, float aux_weight) {
  check_moe_sizes(name_ + ": moe_router_backward", N, E, K);
  const float aux_scale = kmath::moe_aux_grad_scale(aux_weight, E, N);
  moe_router_backward_kernel<<<grid_for(N), kThreads, 0, stream_>>>(dprobs, r, dgate, N, E, K,
                                                                    aux_scale);
  ENGINE_CUDA_LAUNCHED();
}

}  // namespace core
