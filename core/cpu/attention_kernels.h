// The CPU attention kernels: the heads' layout, rotary positions and causal attention, which
// keeps nothing [T, T] between forward and backward (per query block of kAttnBlock rows on
// per-thread scratch, the probabilities recomputed from each row's log-sum-exp).
// Templated on the scalar type: the backend instantiates them for float, the tests also for
// double (central finite differences); the element math is core/kernel_math.h's.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "core/attention_tiles.h"
#include "core/check.h"
#include "core/cpu/bf16_rounding.h"
#include "core/cpu/cpu_gemm.h"
#include "core/cpu/fast_math.h"
#include "core/cpu/parallel_loops.h"
#include "core/kernel_math.h"
#include "core/ops/attention.h"

namespace core::cpu {

// ---- attention layout ------------------------------------------------------------------------

// qkv [B, T, 3, H, hd] <-> q, k, v [B, H, T, hd]. `backward` accumulates into qkv instead.
template <typename T, bool kBackward>
void split_heads_impl(T* q, T* k, T* v, T* qkv, int64_t B, int64_t T_, int64_t H, int64_t hd) {
  int64_t D = H * hd;
#pragma omp parallel for schedule(static) if (B * T_ * 3 * D > kParallelMin)
  for (int64_t bt = 0; bt < B * T_; ++bt) {
    int64_t b = bt / T_, t = bt % T_;
    T* row = qkv + bt * 3 * D;
    T* dst[3] = {q, k, v};
    for (int s = 0; s < 3; ++s) {
      for (int64_t h = 0; h < H; ++h) {
        T* head = dst[s] + ((b * H + h) * T_ + t) * hd;
        T* src = row + s * D + h * hd;
        for (int64_t d = 0; d < hd; ++d) {
          if constexpr (kBackward) {
            src[d] += head[d];
          } else {
            head[d] = src[d];
          }
        }
      }
    }
  }
}

template <typename T>
void split_heads(T* q, T* k, T* v, const T* qkv, int64_t B, int64_t T_, int64_t H, int64_t hd) {
  split_heads_impl<T, false>(q, k, v, const_cast<T*>(qkv), B, T_, H, hd);
}
template <typename T>
void split_heads_backward(T* dqkv, const T* dq, const T* dk, const T* dv, int64_t B, int64_t T_,
                          int64_t H, int64_t hd) {
  split_heads_impl<T, true>(const_cast<T*>(dq), const_cast<T*>(dk), const_cast<T*>(dv), dqkv, B, T_,
                            H, hd);
}

// The bf16 gradient of the fused qkv output from f32 dq, dk, dv: every element of dqkv is
// written (=), each row the f32 row rounded.
template <typename T>
void split_heads_backward(bf16* dqkv, const T* dq, const T* dk, const T* dv, int64_t B, int64_t T_,
                          int64_t H, int64_t hd) {
  const int64_t D = H * hd;
#pragma omp parallel for schedule(static) if (B * T_ * 3 * D > kParallelMin)
  for (int64_t bt = 0; bt < B * T_; ++bt) {
    int64_t b = bt / T_, t = bt % T_;
    const RowStore<T, bf16> store(dqkv + bt * 3 * D, 3 * D);
    const T* src[3] = {dq, dk, dv};
    for (int s = 0; s < 3; ++s) {
      for (int64_t h = 0; h < H; ++h) {
        const T* head = src[s] + ((b * H + h) * T_ + t) * hd;
        T* dst = store.row() + s * D + h * hd;
        for (int64_t d = 0; d < hd; ++d)
          dst[d] = head[d];
      }
    }
    store.commit();
  }
}

// a [B, H, T, hd] <-> out [B, T, H*hd]; the backward accumulates into da.
template <typename T>
void merge_heads(T* out, const T* a, int64_t B, int64_t T_, int64_t H, int64_t hd) {
#pragma omp parallel for schedule(static) if (B * T_ * H * hd > kParallelMin)
  for (int64_t bt = 0; bt < B * T_; ++bt) {
    int64_t b = bt / T_, t = bt % T_;
    for (int64_t h = 0; h < H; ++h) {
      const T* src = a + ((b * H + h) * T_ + t) * hd;
      T* dst = out + bt * H * hd + h * hd;
      for (int64_t d = 0; d < hd; ++d)
        dst[d] = src[d];
    }
  }
}
template <typename T>
void merge_heads_backward(T* da, const T* dout, int64_t B, int64_t T_, int64_t H, int64_t hd) {
#pragma omp parallel for schedule(static) if (B * T_ * H * hd > kParallelMin)
  for (int64_t bt = 0; bt < B * T_; ++bt) {
    int64_t b = bt / T_, t = bt % T_;
    for (int64_t h = 0; h < H; ++h) {
      const T* src = dout + bt * H * hd + h * hd;
      T* dst = da + ((b * H + h) * T_ + t) * hd;
      for (int64_t d = 0; d < hd; ++d)
        dst[d] += src[d];
    }
  }
}

// ---- key offset ------------------------------------------------------------------------------

// AttentionOps::key_offset_forward (backward: its backward) over BH heads [T, hd].
template <typename T>
void key_offset(T* out, const T* inp, int64_t BH, int64_t T_, int64_t hd, bool backward) {
  ENGINE_CHECK(hd % 4 == 0 && hd >= 8,
               "key_offset: needs the truncated rotary's head dim (a multiple of 4, >= 8), got " +
                   std::to_string(hd));
#pragma omp parallel for schedule(static) if (BH * T_ * hd > kParallelMin)
  for (int64_t row = 0; row < BH * T_; ++row) {
    const int64_t t = row % T_;
    for (int64_t d = 0; d < hd; ++d)
      out[row * hd + d] = kmath::key_offset_element(inp + row * hd, t, d, T_, hd, backward);
  }
}

// ---- attention output corrections (record #89's XSA and output gates) -----------------------

// The coefficient of token n, head h (c.values set), and where its gradient goes.
inline float head_coef(const HeadCoefs& c, int64_t n, int64_t h, float off) {
  return c.values ? c.values[n * c.stride + h] : off;
}

template <typename Y>
void attention_out_forward(Y* out, const Y* y, const float* v, int64_t B, int64_t T_, int64_t H,
                           int64_t hd, const HeadCoefs& alpha, const HeadCoefs& gate) {
  const int64_t D = H * hd;
#pragma omp parallel for schedule(static) if (B * T_ * D > kParallelMin)
  for (int64_t n = 0; n < B * T_; ++n) {
    const int64_t b = n / T_, t = n % T_;
    for (int64_t h = 0; h < H; ++h) {
      const float tau = std::tanh(head_coef(alpha, n, h, 0.0f));
      kmath::attention_out_row_forward(out + n * D + h * hd, y + n * D + h * hd,
                                       v + ((b * H + h) * T_ + t) * hd, hd, alpha.values != nullptr,
                                       tau, head_coef(gate, n, h, 1.0f));
    }
  }
}

// The rows in parallel, then the coefficients' gradients added in token order (stride 0 sums).
template <typename Y>
void attention_out_backward(float* dy, float* dv, const float* dout, const Y* y, const float* v,
                            int64_t B, int64_t T_, int64_t H, int64_t hd, const HeadCoefs& alpha,
                            const HeadCoefs& gate) {
  const int64_t D = H * hd, N = B * T_;
  const bool xsa = alpha.values != nullptr;
  std::vector<float> dalpha(static_cast<size_t>(N * H)), dgate(static_cast<size_t>(N * H));
#pragma omp parallel for schedule(static) if (N * D > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const int64_t b = n / T_, t = n % T_;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t vr = ((b * H + h) * T_ + t) * hd;
      const float tau = std::tanh(head_coef(alpha, n, h, 0.0f));
      float dtau = 0.0f, dg = 0.0f;
      kmath::attention_out_row_backward(
          dy + n * D + h * hd, xsa ? dv + vr : nullptr, dtau, dg, dout + n * D + h * hd,
          y + n * D + h * hd, xsa ? v + vr : nullptr, hd, xsa, tau, head_coef(gate, n, h, 1.0f));
      dalpha[n * H + h] = dtau * (1.0f - tau * tau);
      dgate[n * H + h] = dg;
    }
  }
  for (const auto& [c, g] : {std::pair{&alpha, &dalpha}, std::pair{&gate, &dgate}}) {
    if (!c->values || !c->grads) continue;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t h = 0; h < H; ++h)
        c->grads[n * c->stride + h] += (*g)[n * H + h];
  }
}

// ---- rotary ----------------------------------------------------------------------------------

// cos and sin of the rotary angle for every (position, j): two [positions, hd/2] tables, the
// frequencies kmath::rotary_freq's (`table` null: base's).
template <typename T>
void rotary_tables(std::vector<T>& cos_t, std::vector<T>& sin_t, int64_t positions, int64_t half,
                   T base, bool truncated, const float* table = nullptr) {
  cos_t.resize(static_cast<size_t>(positions * half));
  sin_t.resize(static_cast<size_t>(positions * half));
  for (int64_t t = 0; t < positions; ++t) {
    for (int64_t j = 0; j < half; ++j) {
      T angle = T(t) * kmath::rotary_freq(table, j, half, base, truncated);
      cos_t[t * half + j] = std::cos(angle);
      sin_t[t * half + j] = std::sin(angle);
    }
  }
}

// The head dimensions rotary takes: even, and for the truncated form a multiple of 4, >= 8.
inline void check_rotary_head_dim(int64_t hd, bool truncated) {
  ENGINE_CHECK(hd % 2 == 0, "rotary: head dim " + std::to_string(hd) + " is odd");
  ENGINE_CHECK(
      !truncated || (hd % 4 == 0 && hd >= 8),
      "rotary: the truncated form needs a head dim that is a multiple of 4 and >= 8, got " +
          std::to_string(hd));
}

// kBackward: dinp += R^T dout; otherwise out = R inp (in place allowed).
template <typename T, bool kBackward>
void rotary_impl(T* out, const T* inp, int64_t BH, int64_t T_, int64_t hd, T base, bool truncated) {
  check_rotary_head_dim(hd, truncated);
  int64_t half = hd / 2;
  std::vector<T> cos_t, sin_t;
  rotary_tables(cos_t, sin_t, T_, half, base, truncated);
#pragma omp parallel for schedule(static) if (BH * T_ * hd > kParallelMin)
  for (int64_t row = 0; row < BH * T_; ++row) {
    int64_t t = row % T_;
    const T* x = inp + row * hd;
    T* y = out + row * hd;
    for (int64_t j = 0; j < half; ++j) {
      T x0 = x[j], x1 = x[j + half];
      T c = cos_t[t * half + j], s = sin_t[t * half + j];
      if constexpr (kBackward) {
        kmath::rotary_rotate(x0, x1, c, -s);
        y[j] += x0;
        y[j + half] += x1;
      } else {
        kmath::rotary_rotate(x0, x1, c, s);
        y[j] = x0;
        y[j + half] = x1;
      }
    }
  }
}

template <typename T>
void rotary_forward(T* out, const T* inp, int64_t BH, int64_t T_, int64_t hd, T base,
                    bool truncated = false) {
  rotary_impl<T, false>(out, inp, BH, T_, hd, base, truncated);
}
template <typename T>
void rotary_backward(T* dinp, const T* dout, int64_t BH, int64_t T_, int64_t hd, T base,
                     bool truncated = false) {
  rotary_impl<T, true>(dinp, dout, BH, T_, hd, base, truncated);
}

// ---- the modern blocks' attention inputs: split, QK-norm and rotary in one pass
// ------------------
//
// Each row's arithmetic is split_heads', rmsnorm_forward's (norm_kernels.h) and rotary_impl's
// above in their order, and the backward adds into zeros where they add into zeroed buffers, so
// the results are theirs bit for bit (CpuBackend.QkNormRotaryIsTheUnfusedOpsBitForBit).

template <typename T>
void qk_norm_rotary_forward(T* qr, T* kr, T* q, T* k, T* v, T* q_rstd, T* k_rstd, const T* qkv,
                            int64_t B, int64_t T_, int64_t H, int64_t hd, T eps, T base,
                            bool truncated, const RotaryVariant& variant = {}) {
  check_rotary_head_dim(hd, truncated);
  const int64_t D = H * hd, half = hd / 2;
  std::vector<T> cos_t, sin_t;
  rotary_tables(cos_t, sin_t, variant.paired ? 2 * T_ : T_, half, base, truncated,
                variant.inv_freq);
#pragma omp parallel for schedule(static) if (B * T_ * 3 * D > kParallelMin)
  for (int64_t bt = 0; bt < B * T_; ++bt) {
    const int64_t b = bt / T_, t = bt % T_;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t r = (b * H + h) * T_ + t;  // the head row
      const int64_t pos = kmath::rotary_position(t, h, variant.paired);
      const T* src = qkv + bt * 3 * D + h * hd;
      T* split[2] = {q + r * hd, k + r * hd};
      T* out[2] = {qr + r * hd, kr + r * hd};
      T* rstd[2] = {q_rstd + r, k_rstd + r};
      for (int s = 0; s < 2; ++s) {
        const T* x = split[s];
        for (int64_t c = 0; c < hd; ++c)
          split[s][c] = src[s * D + c];
        T ss = T(0);
        for (int64_t c = 0; c < hd; ++c)
          ss += x[c] * x[c];
        const T rs = kmath::rsqrt_eps(ss / T(hd), eps);
        T* y = out[s];
        for (int64_t c = 0; c < hd; ++c)
          y[c] = x[c] * rs;
        *rstd[s] = rs;
        for (int64_t j = 0; j < half; ++j) {
          T x0 = y[j], x1 = y[j + half];
          kmath::rotary_rotate(x0, x1, cos_t[pos * half + j], sin_t[pos * half + j]);
          y[j] = x0;
          y[j + half] = x1;
        }
      }
      for (int64_t c = 0; c < hd; ++c)
        v[r * hd + c] = src[2 * D + c];
    }
  }
}

// dqkv f32 (0 + the value, as an add into zeros) or bf16 (the f32 row rounded once).
template <typename T, typename G>
void qk_norm_rotary_backward(G* dqkv, const T* dqr, const T* dkr, const T* dv, const T* q,
                             const T* k, const T* q_rstd, const T* k_rstd, int64_t B, int64_t T_,
                             int64_t H, int64_t hd, T base, bool truncated,
                             const RotaryVariant& variant = {}) {
  check_rotary_head_dim(hd, truncated);
  const int64_t D = H * hd, half = hd / 2;
  std::vector<T> cos_t, sin_t;
  rotary_tables(cos_t, sin_t, variant.paired ? 2 * T_ : T_, half, base, truncated,
                variant.inv_freq);
#pragma omp parallel if (B * T_ * 3 * D > kParallelMin)
  {
    std::vector<T> g(static_cast<size_t>(hd));  // a row of the rotary's backward
#pragma omp for schedule(static)
    for (int64_t bt = 0; bt < B * T_; ++bt) {
      const int64_t b = bt / T_, t = bt % T_;
      const RowStore<T, G> store(dqkv + bt * 3 * D, 3 * D);
      T* row = store.row();
      for (int64_t h = 0; h < H; ++h) {
        const int64_t r = (b * H + h) * T_ + t;
        const int64_t pos = kmath::rotary_position(t, h, variant.paired);
        const T* grad[2] = {dqr + r * hd, dkr + r * hd};
        const T* split[2] = {q + r * hd, k + r * hd};
        const T rstd[2] = {q_rstd[r], k_rstd[r]};
        for (int s = 0; s < 2; ++s) {
          for (int64_t j = 0; j < half; ++j) {
            T x0 = grad[s][j], x1 = grad[s][j + half];
            kmath::rotary_rotate(x0, x1, cos_t[pos * half + j], -sin_t[pos * half + j]);
            g[j] = T(0) + x0;
            g[j + half] = T(0) + x1;
          }
          const T* x = split[s];
          const T rs = rstd[s];
          T gy = T(0);
          for (int64_t c = 0; c < hd; ++c)
            gy += g[c] * x[c] * rs;
          gy /= T(hd);
          T* dst = row + s * D + h * hd;
          for (int64_t c = 0; c < hd; ++c) {
            const T dx = T(0) + rs * (g[c] - x[c] * rs * gy);
            dst[c] = std::is_same_v<G, T> ? T(0) + dx : dx;
          }
        }
        const T* dvr = dv + r * hd;
        T* dst = row + 2 * D + h * hd;
        for (int64_t c = 0; c < hd; ++c)
          dst[c] = std::is_same_v<G, T> ? T(0) + dvr[c] : dvr[c];
      }
      store.commit();
    }
  }
}

// ---- causal attention ------------------------------------------------------------------------

// How attention spreads over threads: one head per thread with single-threaded GEMMs, or the
// heads one after another with each GEMM using every thread. kAuto picks per head when there
// are at least as many heads as threads.
enum class HeadParallel { kAuto, kHeads, kGemm };

template <typename Fn>
void for_each_head(int64_t BH, HeadParallel mode, Fn fn) {
  bool heads =
      mode == HeadParallel::kHeads || (mode == HeadParallel::kAuto && BH >= omp_get_max_threads());
  if (heads) {
#pragma omp parallel for schedule(static)
    for (int64_t h = 0; h < BH; ++h)
      fn(h);
  } else {
    for (int64_t h = 0; h < BH; ++h)
      fn(h);
  }
}

// Query rows per block: block [r0, r1) only sees keys [0, r1), so the GEMMs skip the masked
// upper triangle except inside the diagonal block (about (nb + 1) / (2 nb) of the full work).
inline constexpr int64_t kAttnBlock = 64;

// One scratch buffer per OpenMP thread for the score blocks of the head that thread works on:
// [kAttnBlock, T] each, freed when the call returns (nothing [T, T] outlives a call).
template <typename T>
class PerThreadScratch {
 public:
  explicit PerThreadScratch(int64_t count)
      : count_(count), buffers_(static_cast<size_t>(omp_get_max_threads())) {}
  T* get() {
    std::vector<T>& b = buffers_.at(static_cast<size_t>(omp_get_thread_num()));
    if (b.empty()) b.resize(static_cast<size_t>(count_));
    return b.data();
  }

 private:
  int64_t count_;
  std::vector<std::vector<T>> buffers_;
};

// The keys query t of head h sees are [first, t]: first = 0 (plain causal) or, with a mask,
// key_begin[(h / heads) T + t] (core/ops/attention.h's AttentionMask).
inline int64_t first_key(const AttentionMask& mask, int64_t h, int64_t T_, int64_t t) {
  return mask.key_begin ? mask.key_begin[(h / mask.heads) * T_ + t] : 0;
}

// S = scale Q K^T, P = causal row softmax of S, out = P V; lse [BH, T] gets each row's
// log-sum-exp of its visible scores, from which the backward recomputes P. With a mask, a query
// block [r0, r1) computes only the keys [first_key(r0), r1) (first_key does not decrease along t)
// and each row's keys below its own first key are masked. Each tensor is where `layout` puts it
// (core/ops/attention.h; the GEMMs read and write its heads at their row strides). Out = bf16
// (T = float): a block's out rows are computed in f32 into scratch by the same GEMM and rounded
// once into out (round_to_bf16), so they are the f32 output's bits rounded.
template <typename T, typename Out = T>
void attention_forward(Out* out, T* lse, const T* q, const T* k, const T* v, int64_t BH, int64_t T_,
                       int64_t hd, T scale, HeadParallel mode = HeadParallel::kAuto,
                       const AttentionMask& mask = {}, const AttentionLayout& layout_in = {}) {
  constexpr bool kRound = !std::is_same_v<Out, T>;
  static_assert(!kRound || (std::is_same_v<Out, bf16> && std::is_same_v<T, float>),
                "attention's output is stored as computed, or rounded from float to bf16");
  const AttentionLayout L = layout_in.resolved(T_, hd);
  PerThreadScratch<T> scratch(kAttnBlock * T_ + (kRound ? kAttnBlock * hd : 0));
  for_each_head(BH, mode, [&](int64_t h) {
    const T* qh = q + L.q.head_at(h, L.heads);
    const T* kh = k + L.k.head_at(h, L.heads);
    const T* vh = v + L.v.head_at(h, L.heads);
    Out* oh = out + L.out.head_at(h, L.heads);
    T* p = scratch.get();         // rows x (r1 - c0) scores, then probabilities, row stride w
    T* ob = p + kAttnBlock * T_;  // kRound: the block's f32 out rows [rows, hd]
    for (int64_t r0 = 0; r0 < T_; r0 += kAttnBlock) {
      int64_t r1 = std::min(T_, r0 + kAttnBlock), rows = r1 - r0;
      const int64_t c0 = first_key(mask, h, T_, r0), w = r1 - c0;
      blas_gemm(false, true, rows, w, hd, scale, qh + r0 * L.q.row, L.q.row, kh + c0 * L.k.row,
                L.k.row, T(0), p, w);
      for (int64_t t = r0; t < r1; ++t) {
        T* row = p + (t - r0) * w;
        const int64_t lo = first_key(mask, h, T_, t) - c0, hi = t - c0;  // visible: [lo, hi]
        T mx = row_max(row + lo, hi - lo + 1);
        T s = T(0);
#pragma omp simd reduction(+ : s)
        for (int64_t j = lo; j <= hi; ++j) {
          row[j] = FastMath::exp(row[j] - mx);
          s += row[j];
        }
        lse[h * T_ + t] = mx + std::log(s);
        T inv = T(1) / s;
        for (int64_t j = lo; j <= hi; ++j)
          row[j] *= inv;
        for (int64_t j = 0; j < lo; ++j)
          row[j] = T(0);
        for (int64_t j = hi + 1; j < w; ++j)
          row[j] = T(0);
      }
      if constexpr (kRound) {
        blas_gemm(false, false, rows, hd, w, T(1), p, w, vh + c0 * L.v.row, L.v.row, T(0), ob, hd);
        for (int64_t t = 0; t < rows; ++t)
          round_to_bf16(oh + (r0 + t) * L.out.row, ob + t * hd, hd);
      } else {
        blas_gemm(false, false, rows, hd, w, T(1), p, w, vh + c0 * L.v.row, L.v.row, T(0),
                  oh + r0 * L.out.row, L.out.row);
      }
    }
  });
}

// Zeroes a head's [T, hd] rows at row stride ld (the rows the key blocks accumulate into).
template <typename T>
void zero_head_rows(T* x, int64_t T_, int64_t hd, int64_t ld) {
  for (int64_t t = 0; t < T_; ++t)
    std::fill(x + t * ld, x + t * ld + hd, T(0));
}

// delta_t = dout_t . out_t over a row of hd: one loop for every stored type of out, so a bf16 out
// gives exactly what the f32 code gives for its widened values (`widened`: hd floats of scratch).
template <typename T, typename O>
T attention_delta(const T* g, const O* o, int64_t hd, T* widened) {
  const T* of = widened;
  if constexpr (std::is_same_v<O, T>) {
    of = o;
  } else {
    for (int64_t d = 0; d < hd; ++d)
      widened[d] = widen<T>(o[d]);
  }
  T delta = T(0);
#pragma omp simd reduction(+ : delta)
  for (int64_t d = 0; d < hd; ++d)
    delta += g[d] * of[d];
  return delta;
}

// Per query block [r0, r1) (keys [c0, r1), c0 = first_key(r0)), from the forward's out and lse:
// P = exp(scale Q K^T - lse) recomputed, dV += P^T dO, dP = dO V^T, dS = P (dP - delta) with
// delta_t = dO_t . out_t, dQ = scale dS K, dK += scale dS^T Q. dq, dk and dv are written (=):
// a block's dQ rows are its own, and a head's dK, dV rows start from zero before its blocks sum.
// O = bf16: out is read widened. G = bf16 (T = float): the same GEMMs write a block's dQ and the
// head's dK, dV sums into f32 scratch (ld hd), rounded once into dq, dk, dv (round_to_bf16): the
// f32 gradients' bits rounded.
template <typename T, typename G = T, typename O = T>
void attention_backward(G* dq, G* dk, G* dv, const T* dout, const O* out, const T* lse, const T* q,
                        const T* k, const T* v, int64_t BH, int64_t T_, int64_t hd, T scale,
                        HeadParallel mode = HeadParallel::kAuto, const AttentionMask& mask = {},
                        const AttentionLayout& layout_in = {}) {
  constexpr bool kRound = !std::is_same_v<G, T>;
  static_assert(!kRound || (std::is_same_v<G, bf16> && std::is_same_v<T, float>),
                "attention's gradients are stored as computed, or rounded from float to bf16");
  static_assert(std::is_same_v<O, T> || (std::is_same_v<O, bf16> && std::is_same_v<T, float>),
                "attention's output is read as computed, or widened from bf16");
  const AttentionLayout L = layout_in.resolved(T_, hd);
  const int64_t rounding = kRound ? kAttnBlock * hd + 2 * T_ * hd : 0;
  PerThreadScratch<T> scratch(2 * kAttnBlock * T_ + hd + rounding);
  for_each_head(BH, mode, [&](int64_t h) {
    const int64_t qo = L.q.head_at(h, L.heads), ko = L.k.head_at(h, L.heads),
                  vo = L.v.head_at(h, L.heads), oo = L.out.head_at(h, L.heads);
    const int64_t lq = L.q.row, lk = L.k.row, lv = L.v.row, lo_ = L.out.row;
    T* p = scratch.get();               // probabilities, row stride w
    T* ds = p + kAttnBlock * T_;        // dP, then dS
    T* widened = ds + kAttnBlock * T_;  // a row of out widened (O = bf16)
    // Where a block's dQ rows and the head's dK, dV sums go: the gradients themselves, or (kRound)
    // f32 scratch at row stride hd.
    T* dqb = widened + hd;
    T *dkh = nullptr, *dvh = nullptr;
    int64_t ldq = hd, ldk = hd, ldv = hd;
    if constexpr (kRound) {
      dkh = dqb + kAttnBlock * hd;
      dvh = dkh + T_ * hd;
    } else {
      dkh = dk + ko, dvh = dv + vo, ldq = lq, ldk = lk, ldv = lv;
    }
    zero_head_rows(dkh, T_, hd, ldk);
    zero_head_rows(dvh, T_, hd, ldv);
    for (int64_t r0 = 0; r0 < T_; r0 += kAttnBlock) {
      int64_t r1 = std::min(T_, r0 + kAttnBlock), rows = r1 - r0;
      const int64_t c0 = first_key(mask, h, T_, r0), w = r1 - c0;
      const T* gb = dout + oo + r0 * lo_;
      const T* qb = q + qo + r0 * lq;
      const int64_t kb = ko + c0 * lk, vb = vo + c0 * lv;
      blas_gemm(false, true, rows, w, hd, scale, qb, lq, k + kb, lk, T(0), p, w);
      for (int64_t t = r0; t < r1; ++t) {
        T* row = p + (t - r0) * w;
        const int64_t lo = first_key(mask, h, T_, t) - c0, hi = t - c0;
        const T row_lse = lse[h * T_ + t];
#pragma omp simd
        for (int64_t j = lo; j <= hi; ++j)
          row[j] = FastMath::exp(row[j] - row_lse);
        for (int64_t j = 0; j < lo; ++j)
          row[j] = T(0);
        for (int64_t j = hi + 1; j < w; ++j)
          row[j] = T(0);
      }
      blas_gemm(true, false, w, hd, rows, T(1), p, w, gb, lo_, T(1), dvh + c0 * ldv, ldv);
      blas_gemm(false, true, rows, w, hd, T(1), gb, lo_, v + vb, lv, T(0), ds, w);
      for (int64_t t = r0; t < r1; ++t) {
        const T* prow = p + (t - r0) * w;
        T* drow = ds + (t - r0) * w;
        const int64_t lo = first_key(mask, h, T_, t) - c0, hi = t - c0;
        const T delta = attention_delta(dout + oo + t * lo_, out + oo + t * lo_, hd, widened);
#pragma omp simd
        for (int64_t j = lo; j <= hi; ++j)
          drow[j] = kmath::attention_dscore(prow[j], drow[j], delta);
        for (int64_t j = 0; j < lo; ++j)
          drow[j] = T(0);
        for (int64_t j = hi + 1; j < w; ++j)
          drow[j] = T(0);
      }
      if constexpr (kRound) {
        blas_gemm(false, false, rows, hd, w, scale, ds, w, k + kb, lk, T(0), dqb, ldq);
        for (int64_t t = 0; t < rows; ++t)
          round_to_bf16(dq + qo + (r0 + t) * lq, dqb + t * hd, hd);
      } else {
        blas_gemm(false, false, rows, hd, w, scale, ds, w, k + kb, lk, T(0), dq + qo + r0 * lq,
                  ldq);
      }
      blas_gemm(true, false, w, hd, rows, scale, ds, w, qb, lq, T(1), dkh + c0 * ldk, ldk);
    }
    if constexpr (kRound) {
      for (int64_t t = 0; t < T_; ++t) {
        round_to_bf16(dk + ko + t * lk, dkh + t * hd, hd);
        round_to_bf16(dv + vo + t * lv, dvh + t * hd, hd);
      }
    }
  });
}

// ---- the row steps of attention as GEMMs (core/attention_by_gemm.h) --------------------------

// s [BH, T, T] (scale q k^T of heads head0 + h) becomes p in place: each row's softmax over the
// keys [first_key, t] it sees (kmath::FlashRow's statistics over the whole row), 0 at the others;
// lse [BH, T] the rows' log-sum-exp.
template <typename T>
void attention_softmax(T* s, T* lse, int64_t BH, int64_t T_, const AttentionMask& mask,
                       int64_t head0) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < BH * T_; ++r) {
    const int64_t t = r % T_, first = first_key(mask, head0 + r / T_, T_, t);
    T* row = s + r * T_;
    T row_max = -std::numeric_limits<T>::infinity();
    for (int64_t j = first; j <= t; ++j)
      row_max = std::max(row_max, row[j]);
    kmath::FlashRow<T> stats;
    stats.advance(row_max);
    for (int64_t j = first; j <= t; ++j)
      stats.sum += stats.weight(row[j]);
    const T l = stats.log_sum_exp();
    lse[r] = l;
    for (int64_t j = 0; j < T_; ++j)
      row[j] = j >= first && j <= t ? kmath::attention_prob(row[j], l) : T(0);
  }
}

// dp [BH, T, T] (dout v^T) becomes ds = p (dp - delta) in place where a query sees a key, 0
// elsewhere; delta_t = dout_t . out_t from dout, out of the same heads, head h's row t at
// h head_stride + t row_stride (0, 0: packed [BH, T, hd]).
template <typename T>
void attention_softmax_backward(T* dp, const T* p, const T* dout, const T* out, int64_t BH,
                                int64_t T_, int64_t hd, const AttentionMask& mask, int64_t head0,
                                int64_t head_stride = 0, int64_t row_stride = 0) {
  if (row_stride == 0) head_stride = T_ * hd, row_stride = hd;
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < BH * T_; ++r) {
    const int64_t t = r % T_, first = first_key(mask, head0 + r / T_, T_, t);
    const int64_t at = r / T_ * head_stride + t * row_stride;
    T delta = 0;
    for (int64_t d = 0; d < hd; ++d)
      delta += dout[at + d] * out[at + d];
    T* row = dp + r * T_;
    const T* prow = p + r * T_;
    for (int64_t j = 0; j < T_; ++j)
      row[j] = j >= first && j <= t ? kmath::attention_dscore(prow[j], row[j], delta) : T(0);
  }
}

}  // namespace core::cpu
