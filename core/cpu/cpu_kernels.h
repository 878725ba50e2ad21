// The CPU fused kernels, templated on the scalar type: the backend instantiates them for float,
// the tests also for double (central finite differences). Semantics are those documented in
// core/backend.h; the per-element math comes from core/kernel_math.h.
//
// Reductions over rows (bias and norm weight gradients, sums of squares) split the rows into
// fixed blocks and add the block sums in order, so results do not depend on the thread count.
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
#include "core/backend.h"
#include "core/check.h"
#include "core/cpu/cpu_gemm.h"
#include "core/cpu/fast_math.h"
#include "core/kernel_math.h"

namespace core::cpu {

// Below this many elements an elementwise loop runs on one thread (a parallel region costs more).
inline constexpr int64_t kParallelMin = 1 << 15;
// Rows per block in the deterministic column reductions.
inline constexpr int64_t kRowBlock = 64;

// max of x[0, n) as a vectorised reduction (std::max in the loop body blocks vectorisation).
template <typename T>
T row_max(const T* x, int64_t n) {
  T mx = -std::numeric_limits<T>::infinity();
#pragma omp simd reduction(max : mx)
  for (int64_t i = 0; i < n; ++i)
    mx = mx > x[i] ? mx : x[i];
  return mx;
}

// dst[c] += sum over rows n of the K partial contributions row_fn(n, partial) writes into
// partial[k * C + c]; K output vectors are handled together.
template <typename T, typename RowFn>
void blocked_column_sums(T* const* dst, int K, int64_t N, int64_t C, RowFn row_fn) {
  int64_t blocks = (N + kRowBlock - 1) / kRowBlock;
  std::vector<T> partial(static_cast<size_t>(blocks * K * C), T(0));
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    T* p = partial.data() + blk * K * C;
    for (int64_t n = blk * kRowBlock; n < std::min(N, (blk + 1) * kRowBlock); ++n)
      row_fn(n, p);
  }
  for (int k = 0; k < K; ++k) {
    if (!dst[k]) continue;
    T* d = dst[k];
#pragma omp parallel for schedule(static) if (C * blocks > kParallelMin)
    for (int64_t c = 0; c < C; ++c) {
      T s = T(0);
      for (int64_t blk = 0; blk < blocks; ++blk)
        s += partial[(blk * K + k) * C + c];
      d[c] += s;
    }
  }
}

// ---- dense helpers ---------------------------------------------------------------------------

template <typename T>
void add_bias(T* out, const T* bias, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    T* o = out + n * C;
    for (int64_t c = 0; c < C; ++c)
      o[c] += bias[c];
  }
}

template <typename T>
void bias_backward(T* dbias, const T* dout, int64_t N, int64_t C) {
  T* dst[1] = {dbias};
  blocked_column_sums(dst, 1, N, C, [&](int64_t n, T* p) {
    const T* g = dout + n * C;
    for (int64_t c = 0; c < C; ++c)
      p[c] += g[c];
  });
}

// ---- elementwise -----------------------------------------------------------------------------

template <typename T, typename Fn>
void elementwise(int64_t n, Fn fn) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i)
    fn(i);
}

template <typename T>
void add(T* out, const T* a, const T* b, int64_t n) {
  elementwise<T>(n, [=](int64_t i) { out[i] = a[i] + b[i]; });
}
template <typename T>
void scale(T* x, T alpha, int64_t n) {
  elementwise<T>(n, [=](int64_t i) { x[i] *= alpha; });
}
template <typename T>
void axpby(T* y, T a, const T* x, T b, int64_t n) {
  elementwise<T>(n, [=](int64_t i) { y[i] = a * x[i] + b * y[i]; });
}
template <typename T>
void gelu_forward(T* out, const T* inp, int64_t n) {
  elementwise<T>(n, [=](int64_t i) { out[i] = kmath::gelu_tanh<FastMath>(inp[i]); });
}
template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, int64_t n) {
  elementwise<T>(n,
                 [=](int64_t i) { dinp[i] += kmath::gelu_tanh_grad<FastMath>(inp[i]) * dout[i]; });
}
template <typename T>
void relu2_forward(T* out, const T* inp, int64_t n) {
  elementwise<T>(n, [=](int64_t i) { out[i] = kmath::relu2(inp[i]); });
}
template <typename T>
void relu2_backward(T* dinp, const T* inp, const T* dout, int64_t n) {
  elementwise<T>(n, [=](int64_t i) { dinp[i] += kmath::relu2_grad(inp[i]) * dout[i]; });
}

// Sum of squares in float64 over fixed blocks added in order.
template <typename T>
double sum_squares(const T* x, int64_t n) {
  constexpr int64_t kBlock = 1 << 14;
  int64_t blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    double s = 0.0;
    for (int64_t i = blk * kBlock; i < std::min(n, (blk + 1) * kBlock); ++i) {
      s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
    }
    partial[blk] = s;
  }
  double total = 0.0;
  for (double p : partial)
    total += p;
  return total;
}

// ---- normalisation ---------------------------------------------------------------------------

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                       int64_t N, int64_t C, T eps) {
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    T m = T(0);
    for (int64_t c = 0; c < C; ++c)
      m += x[c];
    m /= T(C);
    T v = T(0);
    for (int64_t c = 0; c < C; ++c)
      v += (x[c] - m) * (x[c] - m);
    T r = kmath::rsqrt_eps(v / T(C), eps);
    T* o = out + n * C;
    for (int64_t c = 0; c < C; ++c) {
      T y = (x[c] - m) * r;
      o[c] = y * (weight ? weight[c] : T(1)) + (bias ? bias[c] : T(0));
    }
    if (mean) mean[n] = m;
    if (rstd) rstd[n] = r;
  }
}

// With xhat = (x - mean) rstd and g = dout * w:
// dx = rstd (g - mean(g) - xhat mean(g xhat)), dw += dout xhat, db += dout.
template <typename T>
void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                        const T* mean, const T* rstd, int64_t N, int64_t C) {
  if (dinp) {
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
    for (int64_t n = 0; n < N; ++n) {
      const T* x = inp + n * C;
      const T* g = dout + n * C;
      T m = mean[n], r = rstd[n];
      T g_mean = T(0), gx_mean = T(0);
      for (int64_t c = 0; c < C; ++c) {
        T gw = g[c] * (weight ? weight[c] : T(1));
        g_mean += gw;
        gx_mean += gw * (x[c] - m) * r;
      }
      g_mean /= T(C);
      gx_mean /= T(C);
      T* dx = dinp + n * C;
      for (int64_t c = 0; c < C; ++c) {
        T gw = g[c] * (weight ? weight[c] : T(1));
        dx[c] += r * (gw - g_mean - (x[c] - m) * r * gx_mean);
      }
    }
  }
  if (dweight || dbias) {
    T* dst[2] = {dweight, dbias};
    blocked_column_sums(dst, 2, N, C, [&](int64_t n, T* p) {
      const T* x = inp + n * C;
      const T* g = dout + n * C;
      T m = mean[n], r = rstd[n];
      for (int64_t c = 0; c < C; ++c) {
        p[c] += g[c] * (x[c] - m) * r;
        p[C + c] += g[c];
      }
    });
  }
}

template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, int64_t N, int64_t C, T eps) {
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    T ss = T(0);
    for (int64_t c = 0; c < C; ++c)
      ss += x[c] * x[c];
    T r = kmath::rsqrt_eps(ss / T(C), eps);
    T* o = out + n * C;
    for (int64_t c = 0; c < C; ++c)
      o[c] = x[c] * r;
    if (rstd) rstd[n] = r;
  }
}

// y = x r with r = (mean(x^2) + eps)^(-1/2): dx = r (g - y mean(g y)).
template <typename T>
void rmsnorm_backward(T* dinp, const T* dout, const T* inp, const T* rstd, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    const T* g = dout + n * C;
    T r = rstd[n];
    T gy = T(0);
    for (int64_t c = 0; c < C; ++c)
      gy += g[c] * x[c] * r;
    gy /= T(C);
    T* dx = dinp + n * C;
    for (int64_t c = 0; c < C; ++c)
      dx[c] += r * (g[c] - x[c] * r * gy);
  }
}

template <typename T>
void softmax_forward(T* out, const T* inp, int64_t N, int64_t C) {
  if (C == 0) return;
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    T* o = out + n * C;
    T mx = row_max(x, C);
    T s = T(0);
#pragma omp simd reduction(+ : s)
    for (int64_t c = 0; c < C; ++c) {
      o[c] = FastMath::exp(x[c] - mx);
      s += o[c];
    }
    T inv = T(1) / s;
    for (int64_t c = 0; c < C; ++c)
      o[c] *= inv;
  }
}

// dx = y (g - sum(g y)).
template <typename T>
void softmax_backward(T* dinp, const T* dout, const T* out, int64_t N, int64_t C) {
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (int64_t n = 0; n < N; ++n) {
    const T* g = dout + n * C;
    const T* y = out + n * C;
    T dot = T(0);
    for (int64_t c = 0; c < C; ++c)
      dot += g[c] * y[c];
    T* dx = dinp + n * C;
    for (int64_t c = 0; c < C; ++c)
      dx[c] += y[c] * (g[c] - dot);
  }
}

// ---- embeddings ------------------------------------------------------------------------------

inline void check_tokens(const int32_t* tokens, int64_t n, const char* op) {
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0) {
      ENGINE_FAIL(std::string(op) + ": negative token id " + std::to_string(tokens[i]) +
                  " at position " + std::to_string(i));
    }
  }
}

template <typename T>
void embedding_forward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int64_t B,
                       int64_t T_, int64_t D) {
  check_tokens(tokens, B * T_, "embedding_forward");
#pragma omp parallel for schedule(static) if (B * T_ * D > kParallelMin)
  for (int64_t i = 0; i < B * T_; ++i) {
    const T* e = wte + static_cast<int64_t>(tokens[i]) * D;
    const T* p = wpe ? wpe + (i % T_) * D : nullptr;
    T* o = out + i * D;
    for (int64_t d = 0; d < D; ++d)
      o[d] = e[d] + (p ? p[d] : T(0));
  }
}

// Threads own disjoint column ranges, so repeated tokens never race and the order of additions
// into each row of dwte is the token order whatever the thread count.
template <typename T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int64_t B,
                        int64_t T_, int64_t D) {
  check_tokens(tokens, B * T_, "embedding_backward");
  constexpr int64_t kCols = 64;
  int64_t col_blocks = (D + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if (B * T_ * D > kParallelMin)
  for (int64_t cb = 0; cb < col_blocks; ++cb) {
    int64_t c0 = cb * kCols, c1 = std::min(D, c0 + kCols);
    for (int64_t i = 0; i < B * T_; ++i) {
      T* w = dwte + static_cast<int64_t>(tokens[i]) * D;
      const T* g = dout + i * D;
      for (int64_t c = c0; c < c1; ++c)
        w[c] += g[c];
    }
  }
  if (dwpe) {
#pragma omp parallel for schedule(static) if (B * T_ * D > kParallelMin)
    for (int64_t t = 0; t < T_; ++t) {
      T* w = dwpe + t * D;
      for (int64_t b = 0; b < B; ++b) {
        const T* g = dout + (b * T_ + t) * D;
        for (int64_t d = 0; d < D; ++d)
          w[d] += g[d];
      }
    }
  }
}

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

// ---- rotary ----------------------------------------------------------------------------------

// cos and sin of the rotary angle for every (t, j): two [T, hd/2] tables.
template <typename T>
void rotary_tables(std::vector<T>& cos_t, std::vector<T>& sin_t, int64_t T_, int64_t half, T base) {
  cos_t.resize(static_cast<size_t>(T_ * half));
  sin_t.resize(static_cast<size_t>(T_ * half));
  for (int64_t t = 0; t < T_; ++t) {
    for (int64_t j = 0; j < half; ++j) {
      T angle = kmath::rotary_angle(t, j, half, base);
      cos_t[t * half + j] = std::cos(angle);
      sin_t[t * half + j] = std::sin(angle);
    }
  }
}

// kBackward: dinp += R^T dout; otherwise out = R inp (in place allowed).
template <typename T, bool kBackward>
void rotary_impl(T* out, const T* inp, int64_t BH, int64_t T_, int64_t hd, T base) {
  ENGINE_CHECK(hd % 2 == 0, "rotary: head dim " + std::to_string(hd) + " is odd");
  int64_t half = hd / 2;
  std::vector<T> cos_t, sin_t;
  rotary_tables(cos_t, sin_t, T_, half, base);
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
void rotary_forward(T* out, const T* inp, int64_t BH, int64_t T_, int64_t hd, T base) {
  rotary_impl<T, false>(out, inp, BH, T_, hd, base);
}
template <typename T>
void rotary_backward(T* dinp, const T* dout, int64_t BH, int64_t T_, int64_t hd, T base) {
  rotary_impl<T, true>(dinp, dout, BH, T_, hd, base);
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

// S = scale Q K^T, P = causal row softmax of S, out = P V; lse [BH, T] gets each row's
// log-sum-exp of its visible scores, from which the backward recomputes P.
template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, int64_t BH, int64_t T_,
                       int64_t hd, T scale, HeadParallel mode = HeadParallel::kAuto) {
  PerThreadScratch<T> scratch(kAttnBlock * T_);
  for_each_head(BH, mode, [&](int64_t h) {
    const T* qh = q + h * T_ * hd;
    const T* kh = k + h * T_ * hd;
    const T* vh = v + h * T_ * hd;
    T* p = scratch.get();  // rows x r1 scores, then probabilities, row stride r1
    for (int64_t r0 = 0; r0 < T_; r0 += kAttnBlock) {
      int64_t r1 = std::min(T_, r0 + kAttnBlock), rows = r1 - r0;
      blas_gemm(false, true, rows, r1, hd, scale, qh + r0 * hd, hd, kh, hd, T(0), p, r1);
      for (int64_t t = r0; t < r1; ++t) {
        T* row = p + (t - r0) * r1;
        T mx = row_max(row, t + 1);
        T s = T(0);
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j <= t; ++j) {
          row[j] = FastMath::exp(row[j] - mx);
          s += row[j];
        }
        lse[h * T_ + t] = mx + std::log(s);
        T inv = T(1) / s;
        for (int64_t j = 0; j <= t; ++j)
          row[j] *= inv;
        for (int64_t j = t + 1; j < r1; ++j)
          row[j] = T(0);
      }
      blas_gemm(false, false, rows, hd, r1, T(1), p, r1, vh, hd, T(0), out + (h * T_ + r0) * hd,
                hd);
    }
  });
}

// Per query block [r0, r1) (keys [0, r1)), from the forward's out and lse: P = exp(scale Q K^T -
// lse) recomputed, dV += P^T dO, dP = dO V^T, dS = P (dP - delta) with delta_t = dO_t . out_t,
// dQ += scale dS K, dK += scale dS^T Q.
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q,
                        const T* k, const T* v, int64_t BH, int64_t T_, int64_t hd, T scale,
                        HeadParallel mode = HeadParallel::kAuto) {
  PerThreadScratch<T> scratch(2 * kAttnBlock * T_);
  for_each_head(BH, mode, [&](int64_t h) {
    int64_t off = h * T_ * hd;
    T* p = scratch.get();         // probabilities, row stride r1
    T* ds = p + kAttnBlock * T_;  // dP, then dS
    for (int64_t r0 = 0; r0 < T_; r0 += kAttnBlock) {
      int64_t r1 = std::min(T_, r0 + kAttnBlock), rows = r1 - r0;
      const T* gb = dout + off + r0 * hd;
      blas_gemm(false, true, rows, r1, hd, scale, q + off + r0 * hd, hd, k + off, hd, T(0), p, r1);
      for (int64_t t = r0; t < r1; ++t) {
        T* row = p + (t - r0) * r1;
        const T row_lse = lse[h * T_ + t];
#pragma omp simd
        for (int64_t j = 0; j <= t; ++j)
          row[j] = FastMath::exp(row[j] - row_lse);
        for (int64_t j = t + 1; j < r1; ++j)
          row[j] = T(0);
      }
      blas_gemm(true, false, r1, hd, rows, T(1), p, r1, gb, hd, T(1), dv + off, hd);
      blas_gemm(false, true, rows, r1, hd, T(1), gb, hd, v + off, hd, T(0), ds, r1);
      for (int64_t t = r0; t < r1; ++t) {
        const T* prow = p + (t - r0) * r1;
        T* drow = ds + (t - r0) * r1;
        const T* o = out + off + t * hd;
        const T* g = dout + off + t * hd;
        T delta = T(0);
#pragma omp simd reduction(+ : delta)
        for (int64_t d = 0; d < hd; ++d)
          delta += g[d] * o[d];
#pragma omp simd
        for (int64_t j = 0; j <= t; ++j)
          drow[j] = kmath::attention_dscore(prow[j], drow[j], delta);
        for (int64_t j = t + 1; j < r1; ++j)
          drow[j] = T(0);
      }
      blas_gemm(false, false, rows, hd, r1, scale, ds, r1, k + off, hd, T(1), dq + off + r0 * hd,
                hd);
      blas_gemm(true, false, r1, hd, rows, scale, ds, r1, q + off + r0 * hd, hd, T(1), dk + off,
                hd);
    }
  });
}

// ---- loss ------------------------------------------------------------------------------------

// An element of the d logits output: T itself, or bf16 rounded once (bf16 precision).
template <typename G, typename T>
G gradient_as(T g) {
  if constexpr (std::is_same_v<G, bf16>) {
    return kmath::bf16_from_float(static_cast<float>(g));
  } else {
    return g;
  }
}

// Per row: z = softcap(logits[:V]), loss = logsumexp(z) - z[target];
// dlogits = dloss_scale (softmax(z) - onehot) softcap'(logits), zero in the padded columns, as
// T or as bf16 (G). One tanh and one exp per element: z goes to a per-thread row buffer,
// exp(z - max) to dlogits (T) or a second row buffer (bf16). dlogits may alias logits: every
// logit is read (into the buffer) before anything is written.
template <typename T, typename G>
void cross_entropy(T* losses, G* dlogits, const T* logits, const int32_t* targets, int64_t N,
                   int64_t V, int64_t Vp, T softcap, T dloss_scale) {
  ENGINE_CHECK(V > 0 && V <= Vp, "cross_entropy: need 0 < V <= Vp, got V=" + std::to_string(V) +
                                     " Vp=" + std::to_string(Vp));
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] < 0 || targets[n] >= V) {
      ENGINE_FAIL("cross_entropy: target " + std::to_string(targets[n]) + " at row " +
                  std::to_string(n) + " is outside [0, V=" + std::to_string(V) + ")");
    }
  }
  // The exponentials are kept in the output row itself when it holds T (it may alias the
  // logits: each row is read into z first), else in a scratch row.
  constexpr bool in_place = std::is_same_v<G, T>;
#pragma omp parallel if (N * V > kParallelMin)
  {
    std::vector<T> z(static_cast<size_t>(V));
    std::vector<T> scratch(in_place ? 0 : static_cast<size_t>(V));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const T* x = logits + n * Vp;
#pragma omp simd
      for (int64_t j = 0; j < V; ++j)
        z[j] = kmath::softcap<FastMath>(x[j], softcap);
      T mx = row_max(z.data(), V);
      int64_t target = targets[n];
      G* g = dlogits ? dlogits + n * Vp : nullptr;
      T* e = nullptr;
      if constexpr (in_place) {
        e = g;
      } else {
        e = g ? scratch.data() : nullptr;
      }
      T s = T(0);
      if (e) {
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < V; ++j) {
          e[j] = FastMath::exp(z[j] - mx);
          s += e[j];
        }
      } else {
#pragma omp simd reduction(+ : s)
        for (int64_t j = 0; j < V; ++j)
          s += FastMath::exp(z[j] - mx);
      }
      T lse = mx + std::log(s);
      if (losses) losses[n] = lse - z[target];
      if (g) {
        T inv = T(1) / s;
        T p_target = e[target] * inv;
#pragma omp simd
        for (int64_t j = 0; j < V; ++j) {
          g[j] = gradient_as<G>(dloss_scale * e[j] * inv *
                                kmath::softcap_grad_from_output(z[j], softcap));
        }
        // (p - 1) for the target, formed before scaling so no cancellation when p is near 1.
        g[target] = gradient_as<G>(dloss_scale * (p_target - T(1)) *
                                   kmath::softcap_grad_from_output(z[target], softcap));
        for (int64_t j = V; j < Vp; ++j)
          g[j] = gradient_as<G>(T(0));
      }
    }
  }
}

// ---- row gather / scatter --------------------------------------------------------------------

template <typename T>
void gather_rows(T* out, const T* src, const int32_t* index, const T* weight, int64_t n,
                 int64_t D) {
  check_tokens(index, n, "gather_rows");
#pragma omp parallel for schedule(static) if (n * D > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T* s = src + static_cast<int64_t>(index[i]) * D;
    T w = weight ? weight[i] : T(1);
    T* o = out + i * D;
    for (int64_t d = 0; d < D; ++d)
      o[d] = s[d] * w;
  }
}

// Column ranges per thread (as embedding_backward), so repeated indices never race.
template <typename T>
void scatter_add_rows(T* dst, const T* src, const int32_t* index, const T* weight, int64_t n,
                      int64_t D) {
  check_tokens(index, n, "scatter_add_rows");
  constexpr int64_t kCols = 64;
  int64_t col_blocks = (D + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if (n * D > kParallelMin)
  for (int64_t cb = 0; cb < col_blocks; ++cb) {
    int64_t c0 = cb * kCols, c1 = std::min(D, c0 + kCols);
    for (int64_t i = 0; i < n; ++i) {
      T* d = dst + static_cast<int64_t>(index[i]) * D;
      const T* s = src + i * D;
      T w = weight ? weight[i] : T(1);
      for (int64_t c = c0; c < c1; ++c)
        d[c] += s[c] * w;
    }
  }
}

template <typename T>
void row_dot(T* out, const T* a, const T* b, int64_t n, int64_t D) {
#pragma omp parallel for schedule(static) if (n * D > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    T s = T(0);
    for (int64_t d = 0; d < D; ++d)
      s += a[i * D + d] * b[i * D + d];
    out[i] = s;
  }
}

// ---- model: loss reduction, MoE routing ---------------------------------------------------------

// The float64 sum in index order, one rounding to T at the end.
template <typename T>
void mean_loss(T* mean, const T* losses, int64_t n) {
  ENGINE_CHECK(n > 0, "mean_loss: no rows to average");
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i)
    sum += losses[i];
  mean[0] = kmath::mean_from_sum<T>(sum, n);
}

template <typename T>
void accumulate_loss(double* acc, const T* terms, int64_t k) {
  T total = T(0);
  for (int64_t i = 0; i < k; ++i)
    total += terms[i];
  acc[0] += static_cast<double>(total);
}

inline void check_moe_sizes(const char* op, int64_t N, int64_t E, int64_t K) {
  ENGINE_CHECK(N > 0 && K >= 1 && K <= E && E <= INT32_MAX && N * K <= INT32_MAX,
               std::string(op) +
                   ": need N > 0 tokens and 1 <= K <= E experts (rows fit int32), got N=" +
                   std::to_string(N) + " E=" + std::to_string(E) + " K=" + std::to_string(K));
}

// Top-k per token in parallel; counts, offsets, dispatch rows and the aux loss in order.
template <typename T>
void moe_route(const MoeRoutingOf<T>& r, T* aux_loss, const T* probs, int64_t N, int64_t E,
               int64_t K, T aux_weight) {
  check_moe_sizes("moe_route", N, E, K);
#pragma omp parallel for schedule(static) if (N * E * K > kParallelMin)
  for (int64_t t = 0; t < N; ++t)
    r.sel_sum[t] = kmath::moe_top_k(probs + t * E, E, K, r.chosen + t * K);
  std::vector<int64_t> count(static_cast<size_t>(E), 0);
  for (int64_t i = 0; i < N * K; ++i)
    ++count[r.chosen[i]];
  r.offset[0] = 0;
  for (int64_t e = 0; e < E; ++e)
    r.offset[e + 1] = r.offset[e] + static_cast<int32_t>(count[e]);
  // Rows of an expert in token order: the next free row of the expert, token by token.
  std::vector<int32_t> fill(r.offset, r.offset + E);
  for (int64_t t = 0; t < N; ++t) {
    for (int64_t s = 0; s < K; ++s) {
      const int32_t e = r.chosen[t * K + s];
      const int32_t row = fill[e]++;
      r.slot_row[t * K + s] = row;
      r.row_token[row] = static_cast<int32_t>(t);
      r.row_gate[row] = kmath::moe_gate(probs[t * E + e], r.sel_sum[t]);
    }
  }
  double balance = 0.0;
  for (int64_t e = 0; e < E; ++e) {
    double mass = 0.0;
    for (int64_t t = 0; t < N; ++t)
      mass += probs[t * E + e];
    r.mass[e] = mass;
    r.frac[e] = kmath::moe_fraction<T>(count[e], N);
    balance += kmath::moe_balance_term(r.frac[e], mass, N);
  }
  aux_loss[0] += kmath::moe_aux_loss(aux_weight, E, balance);
}

template <typename T>
void moe_router_backward(T* dprobs, const MoeRoutingOf<T>& r, const T* dgate, int64_t N, int64_t E,
                         int64_t K, T aux_weight) {
  check_moe_sizes("moe_router_backward", N, E, K);
  const T aux_scale = kmath::moe_aux_grad_scale(aux_weight, E, N);
#pragma omp parallel for schedule(static) if (N * E > kParallelMin)
  for (int64_t t = 0; t < N; ++t)
    kmath::moe_router_grad(dprobs + t * E, r.frac, aux_scale, E, r.chosen + t * K,
                           r.slot_row + t * K, dgate, r.row_gate, r.sel_sum[t], K);
}

}  // namespace core::cpu
