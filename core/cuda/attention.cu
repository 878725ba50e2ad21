// The CUDA backend's attention family (core/ops/attention.h): head layout, rotary positions
// (kernel_math.h) and causal attention as fused tiled kernels that keep no [T, T] in memory: an
// online-softmax forward saving each row's log-sum-exp, and a backward that recomputes the
// probabilities tile by tile (the math and tiling of core/attention_tiles.h), here on FMA units.
// With tf32 the same kernels run on tensor cores (attention_mma.cu: TF32 operands, or bf16 ones
// in bf16 precision); past their head
// dimensions, as batched TF32 GEMMs (core/attention_by_gemm.h), whose row steps are the softmax
// kernels here (one warp per score row).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <string>
#include <type_traits>

#include "core/attention_by_gemm.h"
#include "core/attention_tiles.h"
#include "core/check.h"
#include "core/cuda/attention_path.h"
#include "core/cuda/attention_tiles.cuh"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_launch.cuh"
#include "core/cuda/cuda_reduce.cuh"
#include "core/kernel_math.h"

namespace core {

using cuda_detail::add_pack;
using cuda_detail::attention_path;
using cuda_detail::AttentionDevice;
using cuda_detail::AttentionPath;
using cuda_detail::begin_of;
using cuda_detail::check_attention_grid;
using cuda_detail::check_sizes;
using cuda_detail::DeviceBuffer;
using cuda_detail::first_index;
using cuda_detail::flash_backward_mma;
using cuda_detail::flash_forward_mma;
using cuda_detail::FloatPack;
using cuda_detail::grid_for;
using cuda_detail::grid_rows;
using cuda_detail::grid_stride;
using cuda_detail::head_begins;
using cuda_detail::heaviest_first_query_tile;
using cuda_detail::kThreads;
using cuda_detail::kTile;
using cuda_detail::last_begin;
using cuda_detail::launch_tiles;
using cuda_detail::load_pack;
using cuda_detail::load_query_tile;
using cuda_detail::load_rows;
using cuda_detail::loaded;
using cuda_detail::MmaOperands;
using cuda_detail::next_key_tile;
using cuda_detail::pack_width;
using cuda_detail::padded_head_dim;
using cuda_detail::row_group_max;
using cuda_detail::row_group_sum;
using cuda_detail::store_pack;
using cuda_detail::stored_as;
using cuda_detail::tile_head_dim;
using cuda_detail::with_head_dim;

namespace {

// ---- attention layout --------------------------------------------------------------------------
//
// One block per token (b, t): its row of H*hd columns in [B*T, parts*H*hd] (qkv: parts = 3, the
// merged output: 1) against the token's rows of [B, H, T, hd], W floats at a time (W divides hd,
// so a pack never straddles two heads). The index math is per token and in 32 bits per column:
// 64-bit divisions per element made these kernels several times slower than their memory traffic.

// Where the columns of token bt's row live in [B, H, T, hd]: (b, head 0, t, 0) is `base`, and
// head h is h T hd further on (the divisions by T once per token, by hd in 32 bits per column).
struct TokenInHeads {
  int64_t base;
  int64_t head_stride;
  int hd;
  __device__ TokenInHeads(int64_t bt, int64_t T, int H, int hd_)
      : base((bt / T * H * T + bt % T) * hd_), head_stride(T * hd_), hd(hd_) {}
  __device__ int64_t operator()(int c) const {
    const int h = c / hd;
    return base + h * head_stride + (c - h * hd);
  }
};

template <int W>
__global__ void split_heads_kernel(float* q, float* k, float* v, const float* qkv, int64_t T, int H,
                                   int hd) {
  const int64_t bt = blockIdx.x;
  const int part = H * hd;  // distance between the q, k and v blocks of one token
  const float* src = qkv + bt * 3 * part;
  const TokenInHeads at(bt, T, H, hd);
  for (int c = threadIdx.x * W; c < part; c += blockDim.x * W) {
    const int64_t dst = at(c);
    store_pack<W>(q + dst, load_pack<W>(src + c));
    store_pack<W>(k + dst, load_pack<W>(src + part + c));
    store_pack<W>(v + dst, load_pack<W>(src + 2 * part + c));
  }
}

template <int W>
__global__ void split_heads_backward_kernel(float* dqkv, const float* dq, const float* dk,
                                            const float* dv, int64_t T, int H, int hd) {
  const int64_t bt = blockIdx.x;
  const int part = H * hd;
  float* dst = dqkv + bt * 3 * part;
  const TokenInHeads at(bt, T, H, hd);
  for (int c = threadIdx.x * W; c < part; c += blockDim.x * W) {
    const int64_t src = at(c);
    const float* grads[3] = {dq, dk, dv};
#pragma unroll
    for (int s = 0; s < 3; ++s) {
      FloatPack<W> acc = load_pack<W>(dst + s * part + c);
      add_pack(acc, load_pack<W>(grads[s] + src));
      store_pack<W>(dst + s * part + c, acc);
    }
  }
}

template <int W>
__global__ void merge_heads_kernel(float* out, const float* a, int64_t T, int H, int hd) {
  const int64_t bt = blockIdx.x;
  const int part = H * hd;
  const TokenInHeads at(bt, T, H, hd);
  for (int c = threadIdx.x * W; c < part; c += blockDim.x * W)
    store_pack<W>(out + bt * part + c, load_pack<W>(a + at(c)));
}

// bf16 precision: the qkv gradient stored as bf16 (each value rounded), written (=), every
// element of it.
__global__ void split_heads_backward_bf16_kernel(bf16* dqkv, const float* dq, const float* dk,
                                                 const float* dv, int64_t T, int H, int hd) {
  const int64_t bt = blockIdx.x;
  const int part = H * hd;
  bf16* dst = dqkv + bt * 3 * part;
  const TokenInHeads at(bt, T, H, hd);
  for (int c = threadIdx.x; c < part; c += blockDim.x) {
    const int64_t src = at(c);
    dst[c] = kmath::bf16_from_float(dq[src]);
    dst[part + c] = kmath::bf16_from_float(dk[src]);
    dst[2 * part + c] = kmath::bf16_from_float(dv[src]);
  }
}

template <int W>
__global__ void merge_heads_backward_kernel(float* da, const float* dout, int64_t T, int H,
                                            int hd) {
  const int64_t bt = blockIdx.x;
  const int part = H * hd;
  const TokenInHeads at(bt, T, H, hd);
  for (int c = threadIdx.x * W; c < part; c += blockDim.x * W) {
    const int64_t dst = at(c);
    FloatPack<W> acc = load_pack<W>(da + dst);
    add_pack(acc, load_pack<W>(dout + bt * part + c));
    store_pack<W>(da + dst, acc);
  }
}

// One thread per rotated pair (j, j + half) of row (bh, t) of x [BH, T, hd].
__global__ void rotary_kernel(float* out, const float* inp, int64_t T, int64_t hd, float base,
                              bool backward, bool truncated, int64_t pairs) {
  const int64_t half = hd / 2;
  for (int64_t i = first_index(); i < pairs; i += grid_stride()) {
    const int64_t j = i % half;
    const int64_t row = i / half;  // bh * T + t
    const int64_t t = row % T;
    const int64_t off = row * hd + j;
    float x0 = inp[off];
    float x1 = inp[off + half];
    kmath::rotary_pair(x0, x1, t, j, half, base, backward, truncated);
    if (backward) {
      out[off] += x0;
      out[off + half] += x1;
    } else {
      out[off] = x0;
      out[off + half] = x1;
    }
  }
}

// ---- attention output corrections (record #89's XSA and output gates) --------------------------
//
// One thread per (token, head) row, the row's arithmetic kmath's (as the CPU's).

__device__ inline float head_coef(const HeadCoefs& c, int64_t n, int64_t h, float off) {
  return c.values ? c.values[n * c.stride + h] : off;
}

// A coefficient's gradient: a token's own place (stride > 0), or one row summed over the tokens.
__device__ inline void add_head_coef_grad(const HeadCoefs& c, int64_t n, int64_t h, float g) {
  if (!c.values || !c.grads) return;
  if (c.stride == 0) {
    atomicAdd(c.grads + h, g);
  } else {
    c.grads[n * c.stride + h] += g;
  }
}

template <typename Y>
__global__ void attention_out_forward_kernel(Y* out, const Y* y, const float* v, int64_t T,
                                             int64_t H, int64_t hd, HeadCoefs alpha, HeadCoefs gate,
                                             int64_t rows) {
  for (int64_t i = first_index(); i < rows; i += grid_stride()) {
    const int64_t n = i / H, h = i % H, b = n / T, t = n % T, D = H * hd;
    const float tau = tanhf(head_coef(alpha, n, h, 0.0f));
    kmath::attention_out_row_forward(out + n * D + h * hd, y + n * D + h * hd,
                                     v + ((b * H + h) * T + t) * hd, hd, alpha.values != nullptr,
                                     tau, head_coef(gate, n, h, 1.0f));
  }
}

template <typename Y>
__global__ void attention_out_backward_kernel(float* dy, float* dv, const float* dout, const Y* y,
                                              const float* v, int64_t T, int64_t H, int64_t hd,
                                              HeadCoefs alpha, HeadCoefs gate, int64_t rows) {
  const bool xsa = alpha.values != nullptr;
  for (int64_t i = first_index(); i < rows; i += grid_stride()) {
    const int64_t n = i / H, h = i % H, b = n / T, t = n % T, D = H * hd;
    const int64_t vr = ((b * H + h) * T + t) * hd;
    const float tau = tanhf(head_coef(alpha, n, h, 0.0f));
    float dtau = 0.0f, dg = 0.0f;
    kmath::attention_out_row_backward(
        dy + n * D + h * hd, xsa ? dv + vr : nullptr, dtau, dg, dout + n * D + h * hd,
        y + n * D + h * hd, xsa ? v + vr : nullptr, hd, xsa, tau, head_coef(gate, n, h, 1.0f));
    add_head_coef_grad(alpha, n, h, dtau * (1.0f - tau * tau));
    add_head_coef_grad(gate, n, h, dg);
  }
}

template <typename Y>
void launch_attention_out_forward(const std::string& name, cudaStream_t stream, Y* out, const Y* y,
                                  const float* v, int64_t B, int64_t T, int64_t H, int64_t hd,
                                  const HeadCoefs& alpha, const HeadCoefs& gate) {
  check_sizes(name, {B, T, H, hd});
  const int64_t rows = B * T * H;
  if (rows == 0 || hd == 0) return;
  attention_out_forward_kernel<<<grid_for(rows), kThreads, 0, stream>>>(out, y, v, T, H, hd, alpha,
                                                                        gate, rows);
  ENGINE_CUDA_LAUNCHED();
}

template <typename Y>
void launch_attention_out_backward(const std::string& name, cudaStream_t stream, float* dy,
                                   float* dv, const float* dout, const Y* y, const float* v,
                                   int64_t B, int64_t T, int64_t H, int64_t hd,
                                   const HeadCoefs& alpha, const HeadCoefs& gate) {
  check_sizes(name, {B, T, H, hd});
  const int64_t rows = B * T * H;
  if (rows == 0 || hd == 0) return;
  attention_out_backward_kernel<<<grid_for(rows), kThreads, 0, stream>>>(dy, dv, dout, y, v, T, H,
                                                                         hd, alpha, gate, rows);
  ENGINE_CUDA_LAUNCHED();
}

// AttentionOps::key_offset_forward (backward: its backward): one thread an element.
__global__ void key_offset_kernel(float* out, const float* inp, int64_t T, int64_t hd,
                                  bool backward, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t d = i % hd, row = i / hd;
    out[i] = kmath::key_offset_element(inp + row * hd, row % T, d, T, hd, backward);
  }
}

void launch_key_offset(const std::string& name, cudaStream_t stream, float* out, const float* inp,
                       int64_t BH, int64_t T, int64_t hd, bool backward) {
  check_sizes(name, {BH, T, hd});
  ENGINE_CHECK(hd % 4 == 0 && hd >= 8,
               name + ": needs the truncated rotary's head dim (a multiple of 4, >= 8), got " +
                   std::to_string(hd));
  const int64_t n = BH * T * hd;
  if (n == 0) return;
  key_offset_kernel<<<grid_for(n), kThreads, 0, stream>>>(out, inp, T, hd, backward, n);
  ENGINE_CUDA_LAUNCHED();
}

// The modern blocks' split, QK-norm and rotary: one warp per (token, head), its lanes over the
// head dimension for the norm's sum of squares (a shuffle reduction) and over the rotated pairs.
constexpr int kQkWarps = kThreads / 32;

__device__ inline int64_t qk_unit() {
  return static_cast<int64_t>(blockIdx.x) * kQkWarps + threadIdx.x / 32;
}
__device__ inline int qk_lane() {
  return static_cast<int>(threadIdx.x % 32);
}

__global__ void qk_norm_rotary_forward_kernel(float* qr, float* kr, float* q, float* k, float* v,
                                              float* q_rstd, float* k_rstd, const float* qkv,
                                              int64_t T, int64_t H, int64_t hd, float eps,
                                              float base, bool truncated, RotaryVariant variant,
                                              int64_t units) {
  const int64_t unit = qk_unit();  // bt H + h
  if (unit >= units) return;
  const int64_t bt = unit / H, h = unit % H, b = bt / T, t = bt % T, D = H * hd, half = hd / 2;
  const int64_t r = (b * H + h) * T + t;
  const int64_t pos = kmath::rotary_position(t, h, variant.paired);
  const int lane = qk_lane();
  const float* src = qkv + bt * 3 * D + h * hd;
  float* split[2] = {q + r * hd, k + r * hd};
  float* out[2] = {qr + r * hd, kr + r * hd};
  float* rstd[2] = {q_rstd + r, k_rstd + r};
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    const float* x = src + s * D;
    float ss = 0.0f;
    for (int64_t c = lane; c < hd; c += 32) {
      const float xc = x[c];
      split[s][c] = xc;
      ss += xc * xc;
    }
    const float rs = kmath::rsqrt_eps(row_group_sum<32>(ss) / static_cast<float>(hd), eps);
    if (lane == 0) *rstd[s] = rs;
    for (int64_t j = lane; j < half; j += 32) {
      float x0 = x[j] * rs, x1 = x[j + half] * rs;
      kmath::rotary_turn(x0, x1, pos,
                         kmath::rotary_freq(variant.inv_freq, j, half, base, truncated), false);
      out[s][j] = x0;
      out[s][j + half] = x1;
    }
  }
  for (int64_t c = lane; c < hd; c += 32)
    v[r * hd + c] = src[2 * D + c];
}

// d qkv (=) from d qr, d kr, d v: the rotary's transpose, then the RMSNorm's backward
// dx = rstd (g - x rstd mean(g x rstd)), each pair's rotation computed twice (for the mean, then
// for dx) rather than kept.
template <typename G>
__global__ void qk_norm_rotary_backward_kernel(G* dqkv, const float* dqr, const float* dkr,
                                               const float* dv, const float* q, const float* k,
                                               const float* q_rstd, const float* k_rstd, int64_t T,
                                               int64_t H, int64_t hd, float base, bool truncated,
                                               RotaryVariant variant, int64_t units) {
  const int64_t unit = qk_unit();
  if (unit >= units) return;
  const int64_t bt = unit / H, h = unit % H, b = bt / T, t = bt % T, D = H * hd, half = hd / 2;
  const int64_t r = (b * H + h) * T + t;
  const int64_t pos = kmath::rotary_position(t, h, variant.paired);
  const int lane = qk_lane();
  G* dst = dqkv + bt * 3 * D + h * hd;
  const float* grad[2] = {dqr + r * hd, dkr + r * hd};
  const float* split[2] = {q + r * hd, k + r * hd};
  const float rstd[2] = {q_rstd[r], k_rstd[r]};
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    const float* g = grad[s];
    const float* x = split[s];
    const float rs = rstd[s];
    float sum = 0.0f;
    for (int64_t j = lane; j < half; j += 32) {
      float g0 = g[j], g1 = g[j + half];
      kmath::rotary_turn(g0, g1, pos,
                         kmath::rotary_freq(variant.inv_freq, j, half, base, truncated), true);
      sum += g0 * x[j] * rs + g1 * x[j + half] * rs;
    }
    const float mean = row_group_sum<32>(sum) / static_cast<float>(hd);
    for (int64_t j = lane; j < half; j += 32) {
      float g0 = g[j], g1 = g[j + half];
      kmath::rotary_turn(g0, g1, pos,
                         kmath::rotary_freq(variant.inv_freq, j, half, base, truncated), true);
      dst[s * D + j] = stored_as<G>(rs * (g0 - x[j] * rs * mean));
      dst[s * D + j + half] = stored_as<G>(rs * (g1 - x[j + half] * rs * mean));
    }
  }
  for (int64_t c = lane; c < hd; c += 32)
    dst[2 * D + c] = stored_as<G>(dv[r * hd + c]);
}

// ---- causal attention ---------------------------------------------------------------------------
//
// Every kernel works on square tiles of kTile queries by kTile keys of one head with 256 threads
// as a 16 x 16 grid: thread (ty, tx) owns rows 4 ty .. 4 ty + 3 of a tile and columns tx + 16 j
// of a tile's score block or of the head dimension. Operands sit in shared memory row-major with
// one float of padding per row, so both the row-wise and the column-wise reads of tile_mma hit
// distinct banks. The head dimension is padded with zeros to HD (32, 64 or 128).

constexpr int kTileThreads = 256;
constexpr int kTileLd = kTile + 1;  // row stride of a score tile in shared memory

// Row stride of a [kTile, HD] operand tile in shared memory.
template <int HD>
constexpr int head_ld() {
  return HD + 1;
}

__device__ inline int tile_ty() {
  return static_cast<int>(threadIdx.x) / 16;
}
__device__ inline int tile_tx() {
  return static_cast<int>(threadIdx.x) % 16;
}

// acc[i][j] += sum_{x < kk} A(4 ty + i, x) B(x, tx + 16 j), A(r, x) = a[r lda + x] and
// B(x, c) = b[c ldb + x] when kBT (B stored transposed) else b[x ldb + c].
template <int NC, bool kBT>
__device__ inline void tile_mma(float (&acc)[4][NC], const float* a, int lda, const float* b,
                                int ldb, int kk) {
  const int r = 4 * tile_ty(), c = tile_tx();
#pragma unroll 4
  for (int x = 0; x < kk; ++x) {
    float av[4], bv[NC];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      av[i] = a[(r + i) * lda + x];
#pragma unroll
    for (int j = 0; j < NC; ++j)
      bv[j] = kBT ? b[(c + 16 * j) * ldb + x] : b[x * ldb + c + 16 * j];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < NC; ++j)
        acc[i][j] += av[i] * bv[j];
  }
}

template <int NC>
__device__ inline void tile_zero(float (&acc)[4][NC]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < NC; ++j)
      acc[i][j] = 0.0f;
}

// Writes factor * acc (tile rows 4 ty + i, head columns tx + 16 j) into a head's [T, hd] rows at
// row stride ld (=: the tile's block is the rows' only producer), as Dst.
template <int NH, typename Dst>
__device__ inline void store_rows(Dst* dst, const float (&acc)[4][NH], int64_t row0, int64_t T,
                                  int64_t hd, int64_t ld, float factor) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t row = row0 + 4 * tile_ty() + i;
    if (row >= T) continue;
#pragma unroll
    for (int j = 0; j < NH; ++j) {
      const int d = tile_tx() + 16 * j;
      if (d < hd) dst[row * ld + d] = stored_as<Dst>(factor * acc[i][j]);
    }
  }
}

// One block per (head, query tile): scan the key tiles from the one holding the tile's first
// begin up to the diagonal with an online softmax per row; out = acc / sum and
// lse = max + log(sum).
template <int HD, typename Out>
__global__ void __launch_bounds__(kTileThreads)
    flash_forward_kernel(Out* out, float* lse, const float* q, const float* k, const float* v,
                         int64_t T, int64_t hd, float scale, AttentionMask mask,
                         AttentionLayout L) {
  constexpr int NH = HD / 16, ld = head_ld<HD>();
  extern __shared__ float smem[];
  float* sq = smem;
  float* sk = sq + kTile * ld;
  float* sv = sk + kTile * ld;
  float* sp = sv + kTile * ld;  // [kTile, kTileLd] probabilities (unnormalised)
  const int64_t head = blockIdx.x, r0 = heaviest_first_query_tile() * kTile;
  q += L.q.head_at(head, L.heads), k += L.k.head_at(head, L.heads);
  v += L.v.head_at(head, L.heads), out += L.out.head_at(head, L.heads);
  const int ty = tile_ty(), tx = tile_tx();
  load_rows<HD, head_ld<HD>()>(sq, q, r0, T, hd, L.q.row);
  kmath::FlashRow<float> row[4];
  float acc[4][NH];
  tile_zero(acc);
  const int32_t* begins = head_begins(mask, head, T);
  const int64_t key_end = kmath::causal_key_end(r0, kTile, T);
  const int64_t key_start = kmath::masked_key_start(begin_of(begins, r0, T), kTile);
  const int64_t tile_last_begin = last_begin(begins, r0, T);
  for (int64_t c0 = key_start; c0 < key_end; c0 += kTile) {
    next_key_tile<HD, head_ld<HD>()>(sk, sv, k, v, c0, T, hd, L.k.row, L.v.row);
    float s[4][4];
    tile_zero(s);
    tile_mma<4, true>(s, sq, ld, sk, ld, HD);
    const bool masked = kmath::tile_needs_mask(r0, kTile, c0, kTile, T) ||
                        kmath::begin_needs_mask(c0, tile_last_begin);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t qi = r0 + 4 * ty + i;
      const int64_t qb = begin_of(begins, qi, T);
      float tile_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const bool seen = !masked || kmath::masked_visible(qi, c0 + tx + 16 * j, T, qb);
        s[i][j] = seen ? s[i][j] * scale : -INFINITY;
        tile_max = fmaxf(tile_max, s[i][j]);
      }
      const float alpha = row[i].advance(row_group_max(tile_max));
#pragma unroll
      for (int j = 0; j < NH; ++j)
        acc[i][j] *= alpha;
      float part = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float p = s[i][j] == -INFINITY ? 0.0f : row[i].weight(s[i][j]);
        sp[(4 * ty + i) * kTileLd + tx + 16 * j] = p;
        part += p;
      }
      row[i].sum += row_group_sum(part);
    }
    __syncthreads();
    tile_mma<NH, false>(acc, sp, kTileLd, sv, ld, kTile);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t qi = r0 + 4 * ty + i;
    if (qi >= T) continue;
    const float inv = 1.0f / row[i].sum;
#pragma unroll
    for (int j = 0; j < NH; ++j) {
      const int d = tx + 16 * j;
      if (d < hd) out[qi * L.out.row + d] = stored_as<Out>(acc[i][j] * inv);
    }
    if (tx == 0) lse[head * T + qi] = row[i].log_sum_exp();
  }
}

// ---- the row steps of attention as GEMMs
// ---------------------------------------------------------

// One warp per score row r of [rows = BH T, T] (head head0 + r / T, query r % T): the row's
// softmax over the keys it sees, in place, 0 at the others; lse[r] its log-sum-exp.
__global__ void attention_softmax_kernel(float* s, float* lse, int64_t rows, int64_t T,
                                         AttentionMask mask, int64_t head0) {
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const int lane = threadIdx.x % 32;
  for (int64_t r = first_index() / 32; r < rows; r += warps) {
    const int64_t t = r % T, first = begin_of(head_begins(mask, head0 + r / T, T), t, T);
    float* row = s + r * T;
    float row_max = -INFINITY;
    for (int64_t j = first + lane; j <= t; j += 32)
      row_max = fmaxf(row_max, row[j]);
    kmath::FlashRow<float> stats;
    stats.advance(row_group_max<32>(row_max));
    float sum = 0.0f;
    for (int64_t j = first + lane; j <= t; j += 32)
      sum += stats.weight(row[j]);
    stats.sum = row_group_sum<32>(sum);
    const float l = stats.log_sum_exp();
    if (lane == 0) lse[r] = l;
    for (int64_t j = lane; j < T; j += 32)
      row[j] = j >= first && j <= t ? kmath::attention_prob(row[j], l) : 0.0f;
  }
}

// One warp per row of dp [rows, T]: ds = p (dp - delta) where the query sees the key, 0 elsewhere,
// delta = dout_r . out_r over hd.
__global__ void attention_softmax_backward_kernel(float* dp, const float* p, const float* dout,
                                                  const float* out, int64_t rows, int64_t T,
                                                  int64_t hd, AttentionMask mask, int64_t head0,
                                                  int64_t head_stride, int64_t row_stride) {
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const int lane = threadIdx.x % 32;
  for (int64_t r = first_index() / 32; r < rows; r += warps) {
    const int64_t t = r % T, first = begin_of(head_begins(mask, head0 + r / T, T), t, T);
    const int64_t at = r / T * head_stride + t * row_stride;
    float delta = 0.0f;
    for (int64_t d = lane; d < hd; d += 32)
      delta += dout[at + d] * out[at + d];
    delta = row_group_sum<32>(delta);
    float* row = dp + r * T;
    const float* prow = p + r * T;
    for (int64_t j = lane; j < T; j += 32)
      row[j] = j >= first && j <= t ? kmath::attention_dscore(prow[j], row[j], delta) : 0.0f;
  }
}

// delta[row] = dout[row] . out[row], one warp per row (bh, t) of [BH T, hd] (dout and out where
// `so` puts them, H heads a batch row); a bf16 out widened.
template <typename O>
__global__ void attention_delta_kernel(float* delta, const float* dout, const O* out, int64_t rows,
                                       int64_t T, int64_t hd, HeadStrides so, int64_t H) {
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const int lane = threadIdx.x % 32;
  for (int64_t row = first_index() / 32; row < rows; row += warps) {
    const int64_t at = so.head_at(row / T, H) + row % T * so.row;
    float s = 0.0f;
    for (int64_t d = lane; d < hd; d += 32)
      s += dout[at + d] * loaded(out[at + d]);
    s = row_group_sum<32>(s);
    if (lane == 0) delta[row] = s;
  }
}

// One block per (head, key tile): over the query tiles that see it (from the diagonal's, until
// the first whose first begin is past the tile), recompute p^T for its keys, dv = sum p^T dout,
// dp^T = v dout^T, ds^T = p^T (dp^T - delta), dk = scale sum ds^T q.
template <int HD, typename G>
__global__ void __launch_bounds__(kTileThreads)
    flash_backward_kv_kernel(G* dk, G* dv, const float* dout, const float* lse, const float* delta,
                             const float* q, const float* k, const float* v, int64_t T, int64_t hd,
                             float scale, AttentionMask mask, AttentionLayout L) {
  constexpr int NH = HD / 16, ld = head_ld<HD>();
  extern __shared__ float smem[];
  float* sk = smem;
  float* sv = sk + kTile * ld;
  float* sq = sv + kTile * ld;
  float* sg = sq + kTile * ld;  // dout
  float* sp = sg + kTile * ld;  // [keys, queries]: p^T, then ds^T
  float* slse = sp + kTile * kTileLd;
  float* sdelta = slse + kTile;
  const int64_t head = blockIdx.x, c0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t qo = L.q.head_at(head, L.heads), ko = L.k.head_at(head, L.heads),
                vo = L.v.head_at(head, L.heads), oo = L.out.head_at(head, L.heads);
  const int ty = tile_ty(), tx = tile_tx();
  load_rows<HD, head_ld<HD>()>(sk, k + ko, c0, T, hd, L.k.row);
  load_rows<HD, head_ld<HD>()>(sv, v + vo, c0, T, hd, L.v.row);
  float dk_acc[4][NH], dv_acc[4][NH];
  tile_zero(dk_acc);
  tile_zero(dv_acc);
  const int64_t query_tiles = (T + kTile - 1) / kTile;
  const int32_t* begins = head_begins(mask, head, T);
  for (int64_t tile = kmath::causal_first_query_tile(c0, kTile); tile < query_tiles; ++tile) {
    const int64_t r0 = tile * kTile;
    if (begin_of(begins, r0, T) >= c0 + kTile) break;  // this and every later tile: keys unseen
    const int64_t tile_last_begin = last_begin(begins, r0, T);
    __syncthreads();  // the previous tile's sq, sg, sp are consumed
    load_query_tile<HD, head_ld<HD>()>(sq, sg, slse, sdelta, q + qo, dout + oo, lse + head * T,
                                       delta + head * T, r0, T, hd, L.q.row, L.out.row);
    __syncthreads();
    float p[4][4];  // p^T: rows are keys, columns queries
    tile_zero(p);
    tile_mma<4, true>(p, sk, ld, sq, ld, HD);
    const bool masked = kmath::tile_needs_mask(r0, kTile, c0, kTile, T) ||
                        kmath::begin_needs_mask(c0, tile_last_begin);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int qi = tx + 16 * j;
        const bool seen = !masked || kmath::masked_visible(r0 + qi, c0 + 4 * ty + i, T,
                                                           begin_of(begins, r0 + qi, T));
        p[i][j] = seen ? kmath::attention_prob(p[i][j] * scale, slse[qi]) : 0.0f;
        sp[(4 * ty + i) * kTileLd + qi] = p[i][j];
      }
    }
    __syncthreads();
    tile_mma<NH, false>(dv_acc, sp, kTileLd, sg, ld, kTile);
    float dp[4][4];
    tile_zero(dp);
    tile_mma<4, true>(dp, sv, ld, sg, ld, HD);
    __syncthreads();  // every thread is done reading p^T from sp
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int qi = tx + 16 * j;
        sp[(4 * ty + i) * kTileLd + qi] = kmath::attention_dscore(p[i][j], dp[i][j], sdelta[qi]);
      }
    }
    __syncthreads();
    tile_mma<NH, false>(dk_acc, sp, kTileLd, sq, ld, kTile);
  }
  store_rows(dk + ko, dk_acc, c0, T, hd, L.k.row, scale);
  store_rows(dv + vo, dv_acc, c0, T, hd, L.v.row, 1.0f);
}

// One block per (head, query tile): over its key tiles (the forward's), recompute p,
// dp = dout v^T, ds = p (dp - delta), dq = scale sum ds k.
template <int HD, typename G>
__global__ void __launch_bounds__(kTileThreads)
    flash_backward_q_kernel(G* dq, const float* dout, const float* lse, const float* delta,
                            const float* q, const float* k, const float* v, int64_t T, int64_t hd,
                            float scale, AttentionMask mask, AttentionLayout L) {
  constexpr int NH = HD / 16, ld = head_ld<HD>();
  extern __shared__ float smem[];
  float* sq = smem;
  float* sg = sq + kTile * ld;  // dout
  float* sk = sg + kTile * ld;
  float* sv = sk + kTile * ld;
  float* sds = sv + kTile * ld;  // [queries, keys]
  float* slse = sds + kTile * kTileLd;
  float* sdelta = slse + kTile;
  const int64_t head = blockIdx.x, r0 = heaviest_first_query_tile() * kTile;
  const int64_t qo = L.q.head_at(head, L.heads), ko = L.k.head_at(head, L.heads),
                vo = L.v.head_at(head, L.heads), oo = L.out.head_at(head, L.heads);
  const int ty = tile_ty(), tx = tile_tx();
  load_query_tile<HD, head_ld<HD>()>(sq, sg, slse, sdelta, q + qo, dout + oo, lse + head * T,
                                     delta + head * T, r0, T, hd, L.q.row, L.out.row);
  float dq_acc[4][NH];
  tile_zero(dq_acc);
  const int32_t* begins = head_begins(mask, head, T);
  const int64_t key_end = kmath::causal_key_end(r0, kTile, T);
  const int64_t key_start = kmath::masked_key_start(begin_of(begins, r0, T), kTile);
  const int64_t tile_last_begin = last_begin(begins, r0, T);
  for (int64_t c0 = key_start; c0 < key_end; c0 += kTile) {
    next_key_tile<HD, head_ld<HD>()>(sk, sv, k + ko, v + vo, c0, T, hd, L.k.row, L.v.row);
    float p[4][4], dp[4][4];
    tile_zero(p);
    tile_zero(dp);
    tile_mma<4, true>(p, sq, ld, sk, ld, HD);
    tile_mma<4, true>(dp, sg, ld, sv, ld, HD);
    const bool masked = kmath::tile_needs_mask(r0, kTile, c0, kTile, T) ||
                        kmath::begin_needs_mask(c0, tile_last_begin);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = 4 * ty + i;
      const int64_t rb = begin_of(begins, r0 + r, T);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int c = tx + 16 * j;
        const bool seen = !masked || kmath::masked_visible(r0 + r, c0 + c, T, rb);
        const float prob = seen ? kmath::attention_prob(p[i][j] * scale, slse[r]) : 0.0f;
        sds[r * kTileLd + c] = kmath::attention_dscore(prob, dp[i][j], sdelta[r]);
      }
    }
    __syncthreads();
    tile_mma<NH, false>(dq_acc, sds, kTileLd, sk, ld, kTile);
  }
  store_rows(dq + qo, dq_acc, r0, T, hd, L.q.row, scale);
}

// Shared memory of the three kernels for head dimension HD, in bytes.
template <int HD>
constexpr size_t forward_smem() {
  return sizeof(float) * (3 * kTile * head_ld<HD>() + kTile * kTileLd);
}
template <int HD>
constexpr size_t backward_smem() {
  return sizeof(float) * (4 * kTile * head_ld<HD>() + kTile * kTileLd + 2 * kTile);
}

template <int HD, typename Out>
void flash_forward(Out* out, float* lse, const float* q, const float* k, const float* v, int64_t BH,
                   int64_t T, int64_t hd, float scale, const AttentionMask& mask,
                   const AttentionLayout& layout, cudaStream_t stream) {
  launch_tiles(flash_forward_kernel<HD, Out>, forward_smem<HD>(), kTileThreads, BH, T, stream, out,
               lse, q, k, v, T, hd, scale, mask, layout);
}

template <int HD, typename G>
void flash_backward(G* dq, G* dk, G* dv, const float* dout, const float* lse, const float* delta,
                    const float* q, const float* k, const float* v, int64_t BH, int64_t T,
                    int64_t hd, float scale, const AttentionMask& mask,
                    const AttentionLayout& layout, cudaStream_t stream) {
  launch_tiles(flash_backward_kv_kernel<HD, G>, backward_smem<HD>(), kTileThreads, BH, T, stream,
               dk, dv, dout, lse, delta, q, k, v, T, hd, scale, mask, layout);
  launch_tiles(flash_backward_q_kernel<HD, G>, backward_smem<HD>(), kTileThreads, BH, T, stream, dq,
               dout, lse, delta, q, k, v, T, hd, scale, mask, layout);
}

}  // namespace

namespace cuda_detail {

size_t flash_smem(int padded_hd) {
  return with_head_dim(padded_hd, [](auto hd) {
    return std::max(forward_smem<decltype(hd)::value>(), backward_smem<decltype(hd)::value>());
  });
}

AttentionPath attention_path(bool tf32, int64_t hd, int64_t T, const AttentionDevice& device) {
  const bool tiles_cover = hd >= 1 && hd <= 128;
  const int padded = tile_head_dim(hd);
  if (tf32 && tiles_cover && device.compute_capability >= 80 &&
      flash_mma_smem(padded) <= device.max_smem_per_block)
    return AttentionPath::kFlashTf32;
  if (tf32 && attention_by_gemm_fits(T)) return AttentionPath::kByGemmTf32;
  if (tiles_cover && flash_smem(padded) > device.max_smem_per_block &&
      attention_by_gemm_fits(T, {.tf32 = false}))
    return AttentionPath::kByGemm;
  return AttentionPath::kFlash;
}

}  // namespace cuda_detail

namespace {

// The head layout's launch: one block per token; W = 4 where hd and every pointer allow it.
// `launch(W, grid, H, hd)` runs the kernel; a token's row (3 H hd columns) must fit an int.
template <typename Launch>
void launch_per_token(const std::string& op, int64_t B, int64_t T, int64_t H, int64_t hd,
                      std::initializer_list<const void*> pointers, Launch launch) {
  check_sizes(op, {B, T, H, hd});
  if (B * T * H * hd == 0) return;
  ENGINE_CHECK(H * hd <= INT_MAX / 3, op + ": a token's " + std::to_string(H) + " x " +
                                          std::to_string(hd) + " head columns exceed the kernel");
  const dim3 grid(grid_rows(B * T, op.c_str()));
  const int h = static_cast<int>(H), d = static_cast<int>(hd);
  if (pack_width(hd, pointers) == 4) {
    launch(std::integral_constant<int, 4>{}, grid, h, d);
  } else {
    launch(std::integral_constant<int, 1>{}, grid, h, d);
  }
  ENGINE_CUDA_LAUNCHED();
}

}  // namespace

void CudaBackend::split_heads(float* q, float* k, float* v, const float* qkv, int64_t B, int64_t T,
                              int64_t H, int64_t hd) {
  launch_per_token(name_ + ": split_heads", B, T, H, hd, {q, k, v, qkv},
                   [&](auto w, dim3 grid, int h, int d) {
                     split_heads_kernel<decltype(w)::value>
                         <<<grid, kThreads, 0, stream_>>>(q, k, v, qkv, T, h, d);
                   });
}

void CudaBackend::split_heads_backward(float* dqkv, const float* dq, const float* dk,
                                       const float* dv, int64_t B, int64_t T, int64_t H,
                                       int64_t hd) {
  launch_per_token(name_ + ": split_heads_backward", B, T, H, hd, {dqkv, dq, dk, dv},
                   [&](auto w, dim3 grid, int h, int d) {
                     split_heads_backward_kernel<decltype(w)::value>
                         <<<grid, kThreads, 0, stream_>>>(dqkv, dq, dk, dv, T, h, d);
                   });
}

void CudaBackend::merge_heads(float* out, const float* a, int64_t B, int64_t T, int64_t H,
                              int64_t hd) {
  launch_per_token(
      name_ + ": merge_heads", B, T, H, hd, {out, a}, [&](auto w, dim3 grid, int h, int d) {
        merge_heads_kernel<decltype(w)::value><<<grid, kThreads, 0, stream_>>>(out, a, T, h, d);
      });
}

void CudaBackend::split_heads_backward(bf16* dqkv, const float* dq, const float* dk,
                                       const float* dv, int64_t B, int64_t T, int64_t H,
                                       int64_t hd) {
  launch_per_token(
      name_ + ": split_heads_backward", B, T, H, hd, {}, [&](auto, dim3 grid, int h, int d) {
        split_heads_backward_bf16_kernel<<<grid, kThreads, 0, stream_>>>(dqkv, dq, dk, dv, T, h, d);
      });
}

void CudaBackend::merge_heads_backward(float* da, const float* dout, int64_t B, int64_t T,
                                       int64_t H, int64_t hd) {
  launch_per_token(name_ + ": merge_heads_backward", B, T, H, hd, {da, dout},
                   [&](auto w, dim3 grid, int h, int d) {
                     merge_heads_backward_kernel<decltype(w)::value>
                         <<<grid, kThreads, 0, stream_>>>(da, dout, T, h, d);
                   });
}

namespace {

void check_qk_norm_rotary(const std::string& op, int64_t B, int64_t T, int64_t H, int64_t hd,
                          bool truncated) {
  check_sizes(op, {B, T, H, hd});
  ENGINE_CHECK(hd % 2 == 0, op + ": head dimension " + std::to_string(hd) + " is odd");
  ENGINE_CHECK(!truncated || (hd % 4 == 0 && hd >= 8),
               op +
                   ": the truncated form needs a head dimension that is a multiple of 4 and >= 8, "
                   "got " +
                   std::to_string(hd));
}

unsigned qk_blocks(int64_t units, const char* op) {
  return grid_rows((units + kQkWarps - 1) / kQkWarps, op);
}

// Both stored types of d qkv.
template <typename G>
void launch_qk_norm_rotary_backward(const std::string& backend, cudaStream_t stream, G* dqkv,
                                    const float* dqr, const float* dkr, const float* dv,
                                    const float* q, const float* k, const float* q_rstd,
                                    const float* k_rstd, int64_t B, int64_t T, int64_t H,
                                    int64_t hd, float base, bool truncated,
                                    const RotaryVariant& variant) {
  check_qk_norm_rotary(backend + ": qk_norm_rotary_backward", B, T, H, hd, truncated);
  const int64_t units = B * T * H;
  if (units == 0 || hd == 0) return;
  qk_norm_rotary_backward_kernel<<<qk_blocks(units, "qk_norm_rotary_backward"), kThreads, 0,
                                   stream>>>(dqkv, dqr, dkr, dv, q, k, q_rstd, k_rstd, T, H, hd,
                                             base, truncated, variant, units);
  ENGINE_CUDA_LAUNCHED();
}

}  // namespace

void CudaBackend::qk_norm_rotary_forward(float* qr, float* kr, float* q, float* k, float* v,
                                         float* q_rstd, float* k_rstd, const float* qkv, int64_t B,
                                         int64_t T, int64_t H, int64_t hd, float eps, float base,
                                         bool truncated, const RotaryVariant& variant) {
  check_qk_norm_rotary(name_ + ": qk_norm_rotary_forward", B, T, H, hd, truncated);
  const int64_t units = B * T * H;
  if (units == 0 || hd == 0) return;
  qk_norm_rotary_forward_kernel<<<qk_blocks(units, "qk_norm_rotary_forward"), kThreads, 0,
                                  stream_>>>(qr, kr, q, k, v, q_rstd, k_rstd, qkv, T, H, hd, eps,
                                             base, truncated, variant, units);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::qk_norm_rotary_backward(float* dqkv, const float* dqr, const float* dkr,
                                          const float* dv, const float* q, const float* k,
                                          const float* q_rstd, const float* k_rstd, int64_t B,
                                          int64_t T, int64_t H, int64_t hd, float base,
                                          bool truncated, const RotaryVariant& variant) {
  launch_qk_norm_rotary_backward(name_, stream_, dqkv, dqr, dkr, dv, q, k, q_rstd, k_rstd, B, T, H,
                                 hd, base, truncated, variant);
}

void CudaBackend::qk_norm_rotary_backward(bf16* dqkv, const float* dqr, const float* dkr,
                                          const float* dv, const float* q, const float* k,
                                          const float* q_rstd, const float* k_rstd, int64_t B,
                                          int64_t T, int64_t H, int64_t hd, float base,
                                          bool truncated, const RotaryVariant& variant) {
  launch_qk_norm_rotary_backward(name_, stream_, dqkv, dqr, dkr, dv, q, k, q_rstd, k_rstd, B, T, H,
                                 hd, base, truncated, variant);
}

void CudaBackend::attention_out_forward(float* out, const float* y, const float* v, int64_t B,
                                        int64_t T, int64_t H, int64_t hd, const HeadCoefs& alpha,
                                        const HeadCoefs& gate) {
  launch_attention_out_forward(name_ + ": attention_out_forward", stream_, out, y, v, B, T, H, hd,
                               alpha, gate);
}

void CudaBackend::attention_out_forward(bf16* out, const bf16* y, const float* v, int64_t B,
                                        int64_t T, int64_t H, int64_t hd, const HeadCoefs& alpha,
                                        const HeadCoefs& gate) {
  launch_attention_out_forward(name_ + ": attention_out_forward", stream_, out, y, v, B, T, H, hd,
                               alpha, gate);
}

void CudaBackend::attention_out_backward(float* dy, float* dv, const float* dout, const float* y,
                                         const float* v, int64_t B, int64_t T, int64_t H,
                                         int64_t hd, const HeadCoefs& alpha,
                                         const HeadCoefs& gate) {
  launch_attention_out_backward(name_ + ": attention_out_backward", stream_, dy, dv, dout, y, v, B,
                                T, H, hd, alpha, gate);
}

void CudaBackend::attention_out_backward(float* dy, float* dv, const float* dout, const bf16* y,
                                         const float* v, int64_t B, int64_t T, int64_t H,
                                         int64_t hd, const HeadCoefs& alpha,
                                         const HeadCoefs& gate) {
  launch_attention_out_backward(name_ + ": attention_out_backward", stream_, dy, dv, dout, y, v, B,
                                T, H, hd, alpha, gate);
}

void CudaBackend::key_offset_forward(float* out, const float* k, int64_t BH, int64_t T,
                                     int64_t hd) {
  launch_key_offset(name_ + ": key_offset_forward", stream_, out, k, BH, T, hd, false);
}

void CudaBackend::key_offset_backward(float* dk, const float* dout, int64_t BH, int64_t T,
                                      int64_t hd) {
  launch_key_offset(name_ + ": key_offset_backward", stream_, dk, dout, BH, T, hd, true);
}

void CudaBackend::rotary_forward(float* out, const float* inp, int64_t BH, int64_t T, int64_t hd,
                                 float base, bool truncated) {
  check_sizes(name_ + ": rotary_forward", {BH, T, hd});
  ENGINE_CHECK(hd % 2 == 0,
               name_ + ": rotary_forward: head dimension " + std::to_string(hd) + " is odd");
  ENGINE_CHECK(!truncated || (hd % 4 == 0 && hd >= 8),
               name_ +
                   ": rotary_forward: the truncated form needs a head dimension that is a "
                   "multiple of 4 and >= 8, got " +
                   std::to_string(hd));
  const int64_t pairs = BH * T * (hd / 2);
  if (pairs == 0) return;
  rotary_kernel<<<grid_for(pairs), kThreads, 0, stream_>>>(out, inp, T, hd, base, false, truncated,
                                                           pairs);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::rotary_backward(float* dinp, const float* dout, int64_t BH, int64_t T, int64_t hd,
                                  float base, bool truncated) {
  check_sizes(name_ + ": rotary_backward", {BH, T, hd});
  ENGINE_CHECK(hd % 2 == 0,
               name_ + ": rotary_backward: head dimension " + std::to_string(hd) + " is odd");
  ENGINE_CHECK(!truncated || (hd % 4 == 0 && hd >= 8),
               name_ +
                   ": rotary_backward: the truncated form needs a head dimension that is a "
                   "multiple of 4 and >= 8, got " +
                   std::to_string(hd));
  const int64_t pairs = BH * T * (hd / 2);
  if (pairs == 0) return;
  rotary_kernel<<<grid_for(pairs), kThreads, 0, stream_>>>(dinp, dout, T, hd, base, true, truncated,
                                                           pairs);
  ENGINE_CUDA_LAUNCHED();
}

namespace {

// Whether the bf16 overloads go through the f32 kernels and rounding passes (the path before the
// kernels stored bf16 themselves; ENGINE_CUDA_ATTENTION_BF16_VIA_F32=1, read at each call), for a
// device run to time both and to fall back on.
bool bf16_attention_via_f32() {
  const char* env = std::getenv("ENGINE_CUDA_ATTENTION_BF16_VIA_F32");
  return env && std::string(env) == "1";
}

// The operands of the tensor-core flash kernels' products: bf16 in bf16 precision (a bf16 output
// or gradient), TF32 otherwise or with ENGINE_CUDA_ATTENTION_BF16_ON_TF32=1 (read at each call;
// the path bf16 runs took before, for a device run to time both and to fall back on).
MmaOperands mma_operands(bool bf16_run) {
  const char* env = std::getenv("ENGINE_CUDA_ATTENTION_BF16_ON_TF32");
  const bool on_tf32 = env && std::string(env) == "1";
  return bf16_run && !on_tf32 ? MmaOperands::kBf16 : MmaOperands::kTf32;
}

// How far from its pointer a tensor of BH heads [T, hd] at strides s (H heads a batch row)
// reaches, in elements: the furthest head's last row's end.
int64_t head_span(const HeadStrides& s, int64_t H, int64_t BH, int64_t T, int64_t hd) {
  int64_t far = s.head_at(BH - 1, H);
  if (BH > H) far = std::max(far, s.head_at(BH / H * H - 1, H));  // the last full batch row's
  return far + (T - 1) * s.row + hd;
}

// Each element of BH heads [T, hd] at strides s (n = BH T hd of them): dst = src, rounded to
// bf16 or widened from it (the gaps between the heads untouched).
template <typename Dst, typename Src>
__global__ void convert_heads_kernel(Dst* dst, const Src* src, HeadStrides s, int64_t H, int64_t T,
                                     int64_t hd, int64_t n) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const int64_t row = i / hd, at = s.head_at(row / T, H) + row % T * s.row + i % hd;
    dst[at] = stored_as<Dst>(loaded(src[at]));
  }
}

template <typename Dst, typename Src>
void convert_heads(Dst* dst, const Src* src, const HeadStrides& s, int64_t H, int64_t BH, int64_t T,
                   int64_t hd, cudaStream_t stream) {
  const int64_t n = BH * T * hd;
  convert_heads_kernel<<<grid_for(n), kThreads, 0, stream>>>(dst, src, s, H, T, hd, n);
  ENGINE_CUDA_LAUNCHED();
}

// f32 stand-ins for up to three bf16 tensors at their own strides (twin(i) + e is tensor i's
// element e): one scratch over the region they span together where that is no larger than
// their spans apart (d q, d k, d v of one d qkv: d qkv's size), else their spans in a row.
class F32Twins {
 public:
  struct Tensor {
    const bf16* data;
    int64_t span;
  };
  F32Twins(Allocator& allocator, std::initializer_list<Tensor> tensors)
      : layout_(plan(tensors)), buffer_(allocator, layout_.total) {}
  float* twin(int i) const { return buffer_.get() + layout_.offset[i]; }

 private:
  struct Layout {
    int64_t total = 0;
    int64_t offset[3] = {0, 0, 0};
  };
  static Layout plan(std::initializer_list<Tensor> tensors) {
    ENGINE_CHECK(tensors.size() <= 3, "attention: at most three bf16 tensors are staged in f32");
    // Addresses as integers: the tensors may lie in different allocations.
    auto at = [](const bf16* p) { return reinterpret_cast<uintptr_t>(p) / sizeof(bf16); };
    uintptr_t lo = UINTPTR_MAX, hi = 0;
    int64_t apart = 0;
    for (const Tensor& t : tensors) {
      lo = std::min(lo, at(t.data));
      hi = std::max(hi, at(t.data) + static_cast<uintptr_t>(t.span));
      apart += t.span;
    }
    const bool together = hi - lo <= static_cast<uintptr_t>(apart);
    Layout l;
    l.total = together ? static_cast<int64_t>(hi - lo) : apart;
    int i = 0;
    int64_t next = 0;
    for (const Tensor& t : tensors) {
      l.offset[i++] = together ? static_cast<int64_t>(at(t.data) - lo) : next;
      next += t.span;
    }
    return l;
  }
  Layout layout_;
  DeviceBuffer<float> buffer_;
};

}  // namespace

template <typename Out>
void CudaBackend::attention_forward_as(Out* out, float* lse, const float* q, const float* k,
                                       const float* v, int64_t BH, int64_t T, int64_t hd,
                                       float scale, const AttentionMask& mask, bool tf32,
                                       const AttentionLayout& layout) {
  const std::string op = name_ + ": attention_forward";
  check_sizes(op, {BH, T, hd});
  if (BH == 0 || T == 0) return;
  check_attention_grid(BH, T, op);
  const AttentionLayout L = layout.resolved(T, hd);
  const AttentionPath path =
      attention_path(tf32, hd, T, {compute_capability_, max_smem_per_block_});
  const bool by_gemm = path == AttentionPath::kByGemmTf32 || path == AttentionPath::kByGemm;
  if constexpr (std::is_same_v<Out, bf16>) {
    if (by_gemm || bf16_attention_via_f32()) {
      // The GEMMs write f32: the f32 overload into a twin of out, rounded once after.
      F32Twins f32(allocator_, {{out, head_span(L.out, L.heads, BH, T, hd)}});
      attention_forward(f32.twin(0), lse, q, k, v, BH, T, hd, scale, mask, tf32, L);
      return convert_heads(out, f32.twin(0), L.out, L.heads, BH, T, hd, stream_);
    }
  } else if (by_gemm) {
    return attention_forward_by_gemm(*this, out, lse, q, k, v, BH, T, hd, scale, mask,
                                     {.tf32 = path == AttentionPath::kByGemmTf32}, L);
  }
  if (path == AttentionPath::kFlashTf32)
    return flash_forward_mma(mma_operands(std::is_same_v<Out, bf16>), padded_head_dim(hd, op), out,
                             lse, q, k, v, BH, T, hd, scale, mask, L, stream_);
  with_head_dim(padded_head_dim(hd, op), [&](auto padded_hd) {
    flash_forward<decltype(padded_hd)::value>(out, lse, q, k, v, BH, T, hd, scale, mask, L,
                                              stream_);
  });
}

template <typename G, typename O>
void CudaBackend::attention_backward_as(G* dq, G* dk, G* dv, const float* dout, const O* out,
                                        const float* lse, const float* q, const float* k,
                                        const float* v, int64_t BH, int64_t T, int64_t hd,
                                        float scale, const AttentionMask& mask, bool tf32,
                                        const AttentionLayout& layout) {
  const std::string op = name_ + ": attention_backward";
  check_sizes(op, {BH, T, hd});
  if (BH == 0 || T == 0) return;
  check_attention_grid(BH, T, op);
  const AttentionLayout L = layout.resolved(T, hd);
  const AttentionPath path =
      attention_path(tf32, hd, T, {compute_capability_, max_smem_per_block_});
  const bool by_gemm = path == AttentionPath::kByGemmTf32 || path == AttentionPath::kByGemm;
  if constexpr (std::is_same_v<G, bf16> || std::is_same_v<O, bf16>) {
    if (by_gemm || bf16_attention_via_f32()) {
      // The f32 overload on f32 twins: a bf16 out widened first, bf16 gradients rounded after.
      const int64_t H = L.heads;
      const float* out_f32 = nullptr;
      std::optional<F32Twins> out_twin;
      if constexpr (std::is_same_v<O, bf16>) {
        out_twin.emplace(allocator_, std::initializer_list<F32Twins::Tensor>{
                                         {out, head_span(L.out, H, BH, T, hd)}});
        convert_heads(out_twin->twin(0), out, L.out, H, BH, T, hd, stream_);
        out_f32 = out_twin->twin(0);
      } else {
        out_f32 = out;
      }
      if constexpr (std::is_same_v<G, bf16>) {
        F32Twins grads(allocator_, {{dq, head_span(L.q, H, BH, T, hd)},
                                    {dk, head_span(L.k, H, BH, T, hd)},
                                    {dv, head_span(L.v, H, BH, T, hd)}});
        attention_backward(grads.twin(0), grads.twin(1), grads.twin(2), dout, out_f32, lse, q, k, v,
                           BH, T, hd, scale, mask, tf32, L);
        convert_heads(dq, grads.twin(0), L.q, H, BH, T, hd, stream_);
        convert_heads(dk, grads.twin(1), L.k, H, BH, T, hd, stream_);
        return convert_heads(dv, grads.twin(2), L.v, H, BH, T, hd, stream_);
      } else {
        return attention_backward(dq, dk, dv, dout, out_f32, lse, q, k, v, BH, T, hd, scale, mask,
                                  tf32, L);
      }
    }
  } else if (by_gemm) {
    return attention_backward_by_gemm(*this, dq, dk, dv, dout, out, q, k, v, BH, T, hd, scale, mask,
                                      {.tf32 = path == AttentionPath::kByGemmTf32}, L);
  }
  const int padded = padded_head_dim(hd, op);
  DeviceBuffer<float> delta(allocator_, BH * T);
  attention_delta_kernel<<<grid_for(BH * T * 32), kThreads, 0, stream_>>>(
      delta.get(), dout, out, BH * T, T, hd, L.out, L.heads);
  ENGINE_CUDA_LAUNCHED();
  if (path == AttentionPath::kFlashTf32)
    return flash_backward_mma(mma_operands(std::is_same_v<G, bf16> || std::is_same_v<O, bf16>),
                              padded, dq, dk, dv, dout, lse, delta.get(), q, k, v, BH, T, hd, scale,
                              mask, L, stream_);
  with_head_dim(padded, [&](auto padded_hd) {
    flash_backward<decltype(padded_hd)::value>(dq, dk, dv, dout, lse, delta.get(), q, k, v, BH, T,
                                               hd, scale, mask, L, stream_);
  });
}

void CudaBackend::attention_forward(float* out, float* lse, const float* q, const float* k,
                                    const float* v, int64_t BH, int64_t T, int64_t hd, float scale,
                                    const AttentionMask& mask, bool tf32,
                                    const AttentionLayout& layout) {
  attention_forward_as(out, lse, q, k, v, BH, T, hd, scale, mask, tf32, layout);
}

void CudaBackend::attention_forward(bf16* out, float* lse, const float* q, const float* k,
                                    const float* v, int64_t BH, int64_t T, int64_t hd, float scale,
                                    const AttentionMask& mask, bool tf32,
                                    const AttentionLayout& layout) {
  attention_forward_as(out, lse, q, k, v, BH, T, hd, scale, mask, tf32, layout);
}

void CudaBackend::attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                     const float* out, const float* lse, const float* q,
                                     const float* k, const float* v, int64_t BH, int64_t T,
                                     int64_t hd, float scale, const AttentionMask& mask, bool tf32,
                                     const AttentionLayout& layout) {
  attention_backward_as(dq, dk, dv, dout, out, lse, q, k, v, BH, T, hd, scale, mask, tf32, layout);
}

void CudaBackend::attention_backward(bf16* dq, bf16* dk, bf16* dv, const float* dout,
                                     const bf16* out, const float* lse, const float* q,
                                     const float* k, const float* v, int64_t BH, int64_t T,
                                     int64_t hd, float scale, const AttentionMask& mask, bool tf32,
                                     const AttentionLayout& layout) {
  attention_backward_as(dq, dk, dv, dout, out, lse, q, k, v, BH, T, hd, scale, mask, tf32, layout);
}

void CudaBackend::attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                     const bf16* out, const float* lse, const float* q,
                                     const float* k, const float* v, int64_t BH, int64_t T,
                                     int64_t hd, float scale, const AttentionMask& mask, bool tf32,
                                     const AttentionLayout& layout) {
  attention_backward_as(dq, dk, dv, dout, out, lse, q, k, v, BH, T, hd, scale, mask, tf32, layout);
}

void CudaBackend::attention_softmax(float* s, float* lse, int64_t BH, int64_t T,
                                    const AttentionMask& mask, int64_t head0) {
  check_sizes(name_ + ": attention_softmax", {BH, T, head0});
  if (BH == 0 || T == 0) return;
  attention_softmax_kernel<<<grid_for(BH * T * 32), kThreads, 0, stream_>>>(s, lse, BH * T, T, mask,
                                                                            head0);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::attention_softmax_backward(float* dp, const float* p, const float* dout,
                                             const float* out, int64_t BH, int64_t T, int64_t hd,
                                             const AttentionMask& mask, int64_t head0,
                                             int64_t head_stride, int64_t row_stride) {
  check_sizes(name_ + ": attention_softmax_backward", {BH, T, hd, head0});
  if (BH == 0 || T == 0) return;
  if (row_stride == 0) head_stride = T * hd, row_stride = hd;
  attention_softmax_backward_kernel<<<grid_for(BH * T * 32), kThreads, 0, stream_>>>(
      dp, p, dout, out, BH * T, T, hd, mask, head0, head_stride, row_stride);
  ENGINE_CUDA_LAUNCHED();
}

}  // namespace core
