// Causal flash attention on tensor cores (sm_80 and later): the three kernels of attention.cu's
// flash path (forward; backward over key tiles for dk, dv; backward over query tiles for dq; the
// math of core/attention_tiles.h, no [T, T] in memory, every output summed in one place in a
// fixed order), with the tile products on tensor cores instead of FMA. The products take TF32
// operands (mma.sync m16n8k8: Tf32Tiles) or, in bf16 precision, bf16 ones (m16n8k16: Bf16Tiles,
// twice the rate, half the k steps); the kernels are the same otherwise.
//
// A block is 4 warps over a tile of kTile = 64 rows; warp w owns rows 16 w .. 16 w + 15 (queries,
// or keys in the dk/dv kernel) and computes its 16 x 64 score block as 8 fragments of 16 x 8.
// Which matrix element each register of a lane holds is core/mma_fragments.h's (checked on the
// host by tests/core/mma_fragments_test.cpp): lane (g, t) holds rows g and g + 8 of each
// fragment, so a row's 64 scores sit on the 4 lanes of its group, reduced by two shuffles; a
// score fragment becomes the A operand of the next product (P V, dS K, ...) in place: in the
// paired order for TF32, two neighbouring fragments in natural order for bf16.
//
// Operand tiles are [kTile, HD + 4] f32 in shared memory (the bf16 products round as they load a
// fragment): with 4 floats of padding a row, both the b[] reads down a column (rows g) and across
// rows 2t and 2t + 1 hit 32 distinct banks.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/attention_tiles.h"
#include "core/cuda/attention_path.h"
#include "core/cuda/attention_tiles.cuh"
#include "core/cuda/cuda_launch.cuh"
#include "core/mma_fragments.h"

namespace core::cuda_detail {

namespace {

constexpr int kMmaThreads = 128;  // 4 warps of 16 tile rows

template <int HD>
constexpr int mma_ld() {
  return HD + 4;
}

// Lane coordinates within the fragments: group g (a row pair) and thread t in the group.
struct Lane {
  int g;
  int t;
  __device__ Lane()
      : g(static_cast<int>(threadIdx.x % 32) / 4), t(static_cast<int>(threadIdx.x % 4)) {}
};

__device__ inline uint32_t to_tf32(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
#else
  return __float_as_uint(x);  // never runs: the dispatch takes these kernels on sm_80+ only
#endif
}

// d += a b for one 16 x 8 x 8 fragment product.
__device__ inline void mma_tf32(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();                   // never runs: the dispatch takes these kernels on sm_80+ only
#endif
}

// A = rows [r0, r0 + 16), columns [k0, k0 + 8) of a shared tile X (row stride LD).
template <int LD>
__device__ inline void a_rows(uint32_t (&a)[4], const float* x, int r0, int k0, Lane l) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const mma::Coord c = mma::a_coord(l.g, l.t, i);
    a[i] = to_tf32(x[(r0 + c.row) * LD + k0 + c.col]);
  }
}

// B = X^T for rows [n0, n0 + 8) of X, columns [k0, k0 + 8): B[k][n] = X[n0 + n][k0 + k].
template <int LD>
__device__ inline void b_transposed(uint32_t (&b)[2], const float* x, int n0, int k0, Lane l) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const mma::Coord c = mma::b_coord(l.g, l.t, i);
    b[i] = to_tf32(x[(n0 + c.col) * LD + k0 + c.row]);
  }
}

// B = rows [k0, k0 + 8) of X, columns [n0, n0 + 8), its rows in the paired order of a_from_c.
template <int LD>
__device__ inline void b_rows_paired(uint32_t (&b)[2], const float* x, int k0, int n0, Lane l) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const mma::Coord c = mma::b_coord(l.g, l.t, i);
    b[i] = to_tf32(x[(k0 + mma::paired_row(c.row)) * LD + n0 + c.col]);
  }
}

// The A operand over a score fragment's 8 columns, in the paired order.
__device__ inline void a_from_c(uint32_t (&a)[4], const float (&c)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
    a[i] = to_tf32(c[mma::c_register_of_a(i)]);
}

// Two floats as the bf16 pair of one register (each rounded to nearest even; lo in the lower
// half, the lower index of the fragment map).
__device__ inline uint32_t bf16_pair(float lo, float hi) {
  const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&p);
}

// d += a b for one 16 x 8 x 16 fragment product on bf16 operands.
__device__ inline void mma_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();                   // never runs: the dispatch takes these kernels on sm_80+ only
#endif
}

// The bf16 loads: a half pair is two neighbouring floats of a tile row (8-byte aligned: LD, k0
// and 2t are even) or of a column (two rows).
// A = rows [r0, r0 + 16), columns [k0, k0 + 16) of a shared tile X (row stride LD).
template <int LD>
__device__ inline void a16_rows(uint32_t (&a)[4], const float* x, int r0, int k0, Lane l) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const mma::Coord c = mma::a16_coord(l.g, l.t, i, 0);
    const float2 p = *reinterpret_cast<const float2*>(x + (r0 + c.row) * LD + k0 + c.col);
    a[i] = bf16_pair(p.x, p.y);
  }
}

// B = X^T for rows [n0, n0 + 8) of X, columns [k0, k0 + 16): B[k][n] = X[n0 + n][k0 + k].
template <int LD>
__device__ inline void b16_transposed(uint32_t (&b)[2], const float* x, int n0, int k0, Lane l) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const mma::Coord c = mma::b16_coord(l.g, l.t, i, 0);
    const float2 p = *reinterpret_cast<const float2*>(x + (n0 + c.col) * LD + k0 + c.row);
    b[i] = bf16_pair(p.x, p.y);
  }
}

// B = rows [k0, k0 + 16) of X, columns [n0, n0 + 8).
template <int LD>
__device__ inline void b16_rows(uint32_t (&b)[2], const float* x, int k0, int n0, Lane l) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const mma::Coord c = mma::b16_coord(l.g, l.t, i, 0);
    const float* at = x + (k0 + c.row) * LD + n0 + c.col;
    b[i] = bf16_pair(at[0], at[LD]);
  }
}

// The A operand over two neighbouring score fragments' 16 columns.
__device__ inline void a16_from_c(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float(&c)[4] = i < 2 ? c0 : c1;
    a[i] = bf16_pair(c[mma::c_register_of_a16(i, 0)], c[mma::c_register_of_a16(i, 1)]);
  }
}

template <int N>
__device__ inline void zero(float (&f)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      f[i][e] = 0.0f;
}

// The fragment operations of one operand type: its k step, the A rows of a tile, the B = X^T and
// B = X rows of a tile, the A operand from score fragments (from fragment j on), the product.
struct Tf32Tiles {
  static constexpr int kK = 8;
  template <int LD>
  __device__ static void a(uint32_t (&a)[4], const float* x, int r0, int k0, Lane l) {
    a_rows<LD>(a, x, r0, k0, l);
  }
  template <int LD>
  __device__ static void b_t(uint32_t (&b)[2], const float* x, int n0, int k0, Lane l) {
    b_transposed<LD>(b, x, n0, k0, l);
  }
  template <int LD>
  __device__ static void b(uint32_t (&b)[2], const float* x, int k0, int n0, Lane l) {
    b_rows_paired<LD>(b, x, k0, n0, l);
  }
  __device__ static void a_from_scores(uint32_t (&a)[4], const float (&s)[8][4], int j) {
    a_from_c(a, s[j]);
  }
  __device__ static void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    mma_tf32(d, a, b);
  }
};
struct Bf16Tiles {
  static constexpr int kK = 16;
  template <int LD>
  __device__ static void a(uint32_t (&a)[4], const float* x, int r0, int k0, Lane l) {
    a16_rows<LD>(a, x, r0, k0, l);
  }
  template <int LD>
  __device__ static void b_t(uint32_t (&b)[2], const float* x, int n0, int k0, Lane l) {
    b16_transposed<LD>(b, x, n0, k0, l);
  }
  template <int LD>
  __device__ static void b(uint32_t (&b)[2], const float* x, int k0, int n0, Lane l) {
    b16_rows<LD>(b, x, k0, n0, l);
  }
  __device__ static void a_from_scores(uint32_t (&a)[4], const float (&s)[8][4], int j) {
    a16_from_c(a, s[j], s[j + 1]);
  }
  __device__ static void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    mma_bf16(d, a, b);
  }
};

// s[8][4] (+)= X rows [r0, r0 + 16) times Y^T over the head dimension: the warp's 16 x 64 scores
// of a tile (Y's kTile rows are the columns).
template <class Tiles, int HD, int LD>
__device__ inline void scores(float (&s)[8][4], const float* x, int r0, const float* y, Lane l) {
  static_assert(HD % Tiles::kK == 0, "the head dimension is a whole number of k steps");
#pragma unroll
  for (int k0 = 0; k0 < HD; k0 += Tiles::kK) {
    uint32_t a[4];
    Tiles::template a<LD>(a, x, r0, k0, l);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      uint32_t b[2];
      Tiles::template b_t<LD>(b, y, 8 * j, k0, l);
      Tiles::mma(s[j], a, b);
    }
  }
}

// acc[HD / 8][4] += s (16 x 64, as fragments) times Y (kTile x HD rows of a shared tile): the
// tile's 64 columns of s in k steps of one (TF32) or two (bf16) score fragments.
template <class Tiles, int HD, int LD>
__device__ inline void times_rows(float (&acc)[HD / 8][4], const float (&s)[8][4], const float* y,
                                  Lane l) {
#pragma unroll
  for (int j = 0; j < 8; j += Tiles::kK / 8) {
    uint32_t a[4];
    Tiles::a_from_scores(a, s, j);
#pragma unroll
    for (int dt = 0; dt < HD / 8; ++dt) {
      uint32_t b[2];
      Tiles::template b<LD>(b, y, 8 * j, 8 * dt, l);
      Tiles::mma(acc[dt], a, b);
    }
  }
}

// Writes factor * acc (the warp's 16 rows from row0 + r0, head columns of its fragments) into a
// head's [T, hd] rows at row stride ld (=: the block is the rows' only producer), as Dst.
template <int HD, typename Dst>
__device__ inline void store_fragment_rows(Dst* dst, const float (&acc)[HD / 8][4], int64_t row0,
                                           int64_t T, int64_t hd, int64_t ld, float factor,
                                           Lane l) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const mma::Coord c = mma::c_coord(l.g, l.t, e);
    const int64_t row = row0 + c.row;
    if (row >= T) continue;
#pragma unroll
    for (int dt = 0; dt < HD / 8; ++dt) {
      const int d = 8 * dt + c.col;
      if (d < hd) dst[row * ld + d] = stored_as<Dst>(factor * acc[dt][e]);
    }
  }
}

// One block per (head, query tile): the key tiles from the one holding the tile's first begin up
// to the diagonal, with an online softmax per row (kmath::FlashRow); out = acc / sum and
// lse = max + log(sum).
template <class Tiles, int HD, typename Out>
__global__ void __launch_bounds__(kMmaThreads)
    flash_forward_mma_kernel(Out* out, float* lse, const float* q, const float* k, const float* v,
                             int64_t T, int64_t hd, float scale, AttentionMask mask,
                             AttentionLayout L) {
  constexpr int LD = mma_ld<HD>();
  extern __shared__ __align__(16) float smem[];  // 16-byte rows: LD is a multiple of 4
  float* sq = smem;
  float* sk = sq + kTile * LD;
  float* sv = sk + kTile * LD;
  const int64_t head = blockIdx.x, r0 = heaviest_first_query_tile() * kTile;
  const int64_t qo = L.q.head_at(head, L.heads), ko = L.k.head_at(head, L.heads),
                vo = L.v.head_at(head, L.heads), oo = L.out.head_at(head, L.heads);
  const Lane l;
  const int wr = 16 * static_cast<int>(threadIdx.x / 32);
  load_rows<HD, LD>(sq, q + qo, r0, T, hd, L.q.row);  // visible after next_key_tile's barriers
  const int32_t* begins = head_begins(mask, head, T);
  const int64_t qi[2] = {r0 + wr + l.g, r0 + wr + l.g + 8};  // rows c_coord(...).row of the lane
  const int64_t qb[2] = {begin_of(begins, qi[0], T), begin_of(begins, qi[1], T)};
  kmath::FlashRow<float> row[2];
  float acc[HD / 8][4];
  zero(acc);
  const int64_t key_end = kmath::causal_key_end(r0, kTile, T);
  const int64_t key_start = kmath::masked_key_start(begin_of(begins, r0, T), kTile);
  const int64_t tile_last_begin = last_begin(begins, r0, T);
  for (int64_t c0 = key_start; c0 < key_end; c0 += kTile) {
    next_key_tile<HD, LD>(sk, sv, k + ko, v + vo, c0, T, hd, L.k.row, L.v.row);
    float s[8][4];
    zero(s);
    scores<Tiles, HD, LD>(s, sq, wr, sk, l);
    const bool masked = kmath::tile_needs_mask(r0, kTile, c0, kTile, T) ||
                        kmath::begin_needs_mask(c0, tile_last_begin);
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const mma::Coord c = mma::c_coord(l.g, l.t, e);
        const int r = c.row / 8;
        const bool seen = !masked || kmath::masked_visible(qi[r], c0 + 8 * j + c.col, T, qb[r]);
        s[j][e] = seen ? s[j][e] * scale : -INFINITY;
        tile_max[r] = fmaxf(tile_max[r], s[j][e]);
      }
    float alpha[2], part[2] = {0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < 2; ++r)
      alpha[r] = row[r].advance(row_group_max<4>(tile_max[r]));
#pragma unroll
    for (int dt = 0; dt < HD / 8; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        acc[dt][e] *= alpha[mma::c_coord(l.g, l.t, e).row / 8];
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = mma::c_coord(l.g, l.t, e).row / 8;
        s[j][e] = s[j][e] == -INFINITY ? 0.0f : row[r].weight(s[j][e]);
        part[r] += s[j][e];
      }
#pragma unroll
    for (int r = 0; r < 2; ++r)
      row[r].sum += row_group_sum<4>(part[r]);
    times_rows<Tiles, HD, LD>(acc, s, sv, l);
  }
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const mma::Coord c = mma::c_coord(l.g, l.t, e);
    const int r = c.row / 8;
    if (qi[r] >= T) continue;
    const float inv = 1.0f / row[r].sum;
#pragma unroll
    for (int dt = 0; dt < HD / 8; ++dt) {
      const int d = 8 * dt + c.col;
      if (d < hd) out[oo + qi[r] * L.out.row + d] = stored_as<Out>(acc[dt][e] * inv);
    }
    if (c.col == 0) lse[head * T + qi[r]] = row[r].log_sum_exp();  // one lane a row
  }
}

// One block per (head, key tile), warp rows are keys: over the query tiles that see the tile
// (from the diagonal's, until the first whose first begin is past it), recompute p^T,
// dp^T = v dout^T, ds^T = p^T (dp^T - delta); dv += p^T dout, dk += scale ds^T q.
template <class Tiles, int HD, typename G>
__global__ void __launch_bounds__(kMmaThreads)
    flash_backward_kv_mma_kernel(G* dk, G* dv, const float* dout, const float* lse,
                                 const float* delta, const float* q, const float* k, const float* v,
                                 int64_t T, int64_t hd, float scale, AttentionMask mask,
                                 AttentionLayout L) {
  constexpr int LD = mma_ld<HD>();
  extern __shared__ __align__(16) float smem[];  // 16-byte rows: LD is a multiple of 4
  float* sk = smem;
  float* sv = sk + kTile * LD;
  float* sq = sv + kTile * LD;
  float* sg = sq + kTile * LD;  // dout
  float* slse = sg + kTile * LD;
  float* sdelta = slse + kTile;
  const int64_t head = blockIdx.x, c0 = static_cast<int64_t>(blockIdx.y) * kTile;
  const int64_t qo = L.q.head_at(head, L.heads), ko = L.k.head_at(head, L.heads),
                vo = L.v.head_at(head, L.heads), oo = L.out.head_at(head, L.heads);
  const Lane l;
  const int wr = 16 * static_cast<int>(threadIdx.x / 32);
  load_rows<HD, LD>(sk, k + ko, c0, T, hd, L.k.row);
  load_rows<HD, LD>(sv, v + vo, c0, T, hd, L.v.row);
  float dk_acc[HD / 8][4], dv_acc[HD / 8][4];
  zero(dk_acc);
  zero(dv_acc);
  const int64_t query_tiles = (T + kTile - 1) / kTile;
  const int32_t* begins = head_begins(mask, head, T);
  for (int64_t tile = kmath::causal_first_query_tile(c0, kTile); tile < query_tiles; ++tile) {
    const int64_t r0 = tile * kTile;
    if (begin_of(begins, r0, T) >= c0 + kTile) break;  // this and every later tile: keys unseen
    const int64_t tile_last_begin = last_begin(begins, r0, T);
    __syncthreads();  // the previous tile's sq, sg are consumed
    load_query_tile<HD, LD>(sq, sg, slse, sdelta, q + qo, dout + oo, lse + head * T,
                            delta + head * T, r0, T, hd, L.q.row, L.out.row);
    __syncthreads();
    float p[8][4], ds[8][4];  // rows: the warp's keys; columns: the tile's queries
    zero(p);
    zero(ds);
    scores<Tiles, HD, LD>(p, sk, wr, sq, l);
    scores<Tiles, HD, LD>(ds, sv, wr, sg, l);  // dp^T
    const bool masked = kmath::tile_needs_mask(r0, kTile, c0, kTile, T) ||
                        kmath::begin_needs_mask(c0, tile_last_begin);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const mma::Coord c = mma::c_coord(l.g, l.t, e);
        const int qc = 8 * j + c.col;  // the query's column in the tile
        const int64_t key = c0 + wr + c.row;
        const bool seen =
            !masked || kmath::masked_visible(r0 + qc, key, T, begin_of(begins, r0 + qc, T));
        p[j][e] = seen ? kmath::attention_prob(p[j][e] * scale, slse[qc]) : 0.0f;
        ds[j][e] = kmath::attention_dscore(p[j][e], ds[j][e], sdelta[qc]);
      }
    times_rows<Tiles, HD, LD>(dv_acc, p, sg, l);
    times_rows<Tiles, HD, LD>(dk_acc, ds, sq, l);
  }
  store_fragment_rows<HD>(dk + ko, dk_acc, c0 + wr, T, hd, L.k.row, scale, l);
  store_fragment_rows<HD>(dv + vo, dv_acc, c0 + wr, T, hd, L.v.row, 1.0f, l);
}

// One block per (head, query tile), warp rows are queries: over its key tiles (the forward's),
// recompute p, dp = dout v^T, ds = p (dp - delta); dq += scale ds k.
template <class Tiles, int HD, typename G>
__global__ void __launch_bounds__(kMmaThreads)
    flash_backward_q_mma_kernel(G* dq, const float* dout, const float* lse, const float* delta,
                                const float* q, const float* k, const float* v, int64_t T,
                                int64_t hd, float scale, AttentionMask mask, AttentionLayout L) {
  constexpr int LD = mma_ld<HD>();
  extern __shared__ __align__(16) float smem[];  // 16-byte rows: LD is a multiple of 4
  float* sq = smem;
  float* sg = sq + kTile * LD;  // dout
  float* sk = sg + kTile * LD;
  float* sv = sk + kTile * LD;
  float* slse = sv + kTile * LD;
  float* sdelta = slse + kTile;
  const int64_t head = blockIdx.x, r0 = heaviest_first_query_tile() * kTile;
  const int64_t qo = L.q.head_at(head, L.heads), ko = L.k.head_at(head, L.heads),
                vo = L.v.head_at(head, L.heads), oo = L.out.head_at(head, L.heads);
  const Lane l;
  const int wr = 16 * static_cast<int>(threadIdx.x / 32);
  // Visible after next_key_tile's barriers.
  load_query_tile<HD, LD>(sq, sg, slse, sdelta, q + qo, dout + oo, lse + head * T, delta + head * T,
                          r0, T, hd, L.q.row, L.out.row);
  const int32_t* begins = head_begins(mask, head, T);
  const int64_t qi[2] = {r0 + wr + l.g, r0 + wr + l.g + 8};  // rows c_coord(...).row of the lane
  const int64_t qb[2] = {begin_of(begins, qi[0], T), begin_of(begins, qi[1], T)};
  float dq_acc[HD / 8][4];
  zero(dq_acc);
  const int64_t key_end = kmath::causal_key_end(r0, kTile, T);
  const int64_t key_start = kmath::masked_key_start(begin_of(begins, r0, T), kTile);
  const int64_t tile_last_begin = last_begin(begins, r0, T);
  for (int64_t c0 = key_start; c0 < key_end; c0 += kTile) {
    next_key_tile<HD, LD>(sk, sv, k + ko, v + vo, c0, T, hd, L.k.row, L.v.row);
    float ds[8][4], dp[8][4];
    zero(ds);
    zero(dp);
    scores<Tiles, HD, LD>(ds, sq, wr, sk, l);  // s, then ds in place
    scores<Tiles, HD, LD>(dp, sg, wr, sv, l);
    const bool masked = kmath::tile_needs_mask(r0, kTile, c0, kTile, T) ||
                        kmath::begin_needs_mask(c0, tile_last_begin);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const mma::Coord c = mma::c_coord(l.g, l.t, e);
        const int r = c.row / 8, rc = wr + c.row;  // the query's row in the tile
        const bool seen = !masked || kmath::masked_visible(qi[r], c0 + 8 * j + c.col, T, qb[r]);
        const float prob = seen ? kmath::attention_prob(ds[j][e] * scale, slse[rc]) : 0.0f;
        ds[j][e] = kmath::attention_dscore(prob, dp[j][e], sdelta[rc]);
      }
    times_rows<Tiles, HD, LD>(dq_acc, ds, sk, l);
  }
  store_fragment_rows<HD>(dq + qo, dq_acc, r0 + wr, T, hd, L.q.row, scale, l);
}

// Shared memory of the kernels for head dimension HD, in bytes.
template <int HD>
constexpr size_t forward_smem() {
  return sizeof(float) * 3 * kTile * mma_ld<HD>();
}
template <int HD>
constexpr size_t backward_smem() {
  return sizeof(float) * (4 * kTile * mma_ld<HD>() + 2 * kTile);
}

template <class Tiles, int HD, typename Out>
void forward(Out* out, float* lse, const float* q, const float* k, const float* v, int64_t BH,
             int64_t T, int64_t hd, float scale, const AttentionMask& mask,
             const AttentionLayout& layout, cudaStream_t stream) {
  launch_tiles(flash_forward_mma_kernel<Tiles, HD, Out>, forward_smem<HD>(), kMmaThreads, BH, T,
               stream, out, lse, q, k, v, T, hd, scale, mask, layout);
}

template <class Tiles, int HD, typename G>
void backward(G* dq, G* dk, G* dv, const float* dout, const float* lse, const float* delta,
              const float* q, const float* k, const float* v, int64_t BH, int64_t T, int64_t hd,
              float scale, const AttentionMask& mask, const AttentionLayout& layout,
              cudaStream_t stream) {
  launch_tiles(flash_backward_kv_mma_kernel<Tiles, HD, G>, backward_smem<HD>(), kMmaThreads, BH, T,
               stream, dk, dv, dout, lse, delta, q, k, v, T, hd, scale, mask, layout);
  launch_tiles(flash_backward_q_mma_kernel<Tiles, HD, G>, backward_smem<HD>(), kMmaThreads, BH, T,
               stream, dq, dout, lse, delta, q, k, v, T, hd, scale, mask, layout);
}

// Calls f with the operand type's tiles.
template <typename Fn>
void with_operands(MmaOperands operands, Fn&& f) {
  if (operands == MmaOperands::kBf16) {
    f(Bf16Tiles{});
  } else {
    f(Tf32Tiles{});
  }
}

}  // namespace

size_t flash_mma_smem(int padded_hd) {
  return with_head_dim(padded_hd, [](auto hd) {
    return std::max(forward_smem<decltype(hd)::value>(), backward_smem<decltype(hd)::value>());
  });
}

template <typename Out>
void flash_forward_mma(MmaOperands operands, int HD, Out* out, float* lse, const float* q,
                       const float* k, const float* v, int64_t BH, int64_t T, int64_t hd,
                       float scale, const AttentionMask& mask, const AttentionLayout& layout,
                       cudaStream_t stream) {
  with_operands(operands, [&](auto tiles) {
    with_head_dim(HD, [&](auto padded) {
      forward<decltype(tiles), decltype(padded)::value, Out>(out, lse, q, k, v, BH, T, hd, scale,
                                                             mask, layout, stream);
    });
  });
}

template <typename G>
void flash_backward_mma(MmaOperands operands, int HD, G* dq, G* dk, G* dv, const float* dout,
                        const float* lse, const float* delta, const float* q, const float* k,
                        const float* v, int64_t BH, int64_t T, int64_t hd, float scale,
                        const AttentionMask& mask, const AttentionLayout& layout,
                        cudaStream_t stream) {
  with_operands(operands, [&](auto tiles) {
    with_head_dim(HD, [&](auto padded) {
      backward<decltype(tiles), decltype(padded)::value, G>(dq, dk, dv, dout, lse, delta, q, k, v,
                                                            BH, T, hd, scale, mask, layout, stream);
    });
  });
}

// The stored types: f32, and bf16 precision's bf16.
template void flash_forward_mma(MmaOperands, int, float*, float*, const float*, const float*,
                                const float*, int64_t, int64_t, int64_t, float,
                                const AttentionMask&, const AttentionLayout&, cudaStream_t);
template void flash_forward_mma(MmaOperands, int, bf16*, float*, const float*, const float*,
                                const float*, int64_t, int64_t, int64_t, float,
                                const AttentionMask&, const AttentionLayout&, cudaStream_t);
template void flash_backward_mma(MmaOperands, int, float*, float*, float*, const float*,
                                 const float*, const float*, const float*, const float*,
                                 const float*, int64_t, int64_t, int64_t, float,
                                 const AttentionMask&, const AttentionLayout&, cudaStream_t);
template void flash_backward_mma(MmaOperands, int, bf16*, bf16*, bf16*, const float*, const float*,
                                 const float*, const float*, const float*, const float*, int64_t,
                                 int64_t, int64_t, float, const AttentionMask&,
                                 const AttentionLayout&, cudaStream_t);

}  // namespace core::cuda_detail
