// The CPU MoE kernels: rows gathered and scattered by index (repeated indices never race), the
// per-row dot, the top-k routing and its backward.
// Templated on the scalar type: the backend instantiates them for float, the tests also for
// double (central finite differences); the element math is core/kernel_math.h's.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/cpu/bf16_rounding.h"
#include "core/cpu/embedding_kernels.h"
#include "core/cpu/parallel_loops.h"
#include "core/kernel_math.h"
#include "core/ops/moe.h"

namespace core::cpu {

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

// out[i, :] = src[index[i], :] for rows of any element type (bf16 activations), copied as they are.
template <typename E>
void gather_rows(E* out, const E* src, const int32_t* index, int64_t n, int64_t D) {
  check_tokens(index, n, "gather_rows");
#pragma omp parallel for schedule(static) if (n * D > kParallelMin)
  for (int64_t i = 0; i < n; ++i)
    std::copy_n(src + static_cast<int64_t>(index[i]) * D, D, out + i * D);
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

// bf16 precision's residual add of the experts' outputs: out[t, :] = base[t, :] + the sum of
// rows[r, :] * gate[r] over token t's K dispatch rows r = slot_row[t, :] taken in ascending r
// (scatter_add_rows' order into a copy of base), in float from the widened base, each value
// rounded once. out may equal base (each row is read before it is written).
inline void combine_rows(bf16* out, const bf16* base, const float* rows, const int32_t* slot_row,
                         const float* gate, int64_t N, int64_t K, int64_t D) {
  check_tokens(slot_row, N * K, "combine_rows");
#pragma omp parallel for schedule(static) if (N * D > kParallelMin)
  for (int64_t t = 0; t < N; ++t) {
    thread_local std::vector<int32_t> order;
    order.assign(slot_row + t * K, slot_row + (t + 1) * K);
    std::sort(order.begin(), order.end());
    const RowLoad<float, bf16> in(base + t * D, D);
    const RowStore<float, bf16> store(out + t * D, D);
    float* o = store.row();
    std::copy_n(in.row(), D, o);
    for (int32_t r : order) {
      const float* s = rows + static_cast<int64_t>(r) * D;
      const float w = gate[r];
      for (int64_t c = 0; c < D; ++c)
        o[c] += s[c] * w;
    }
    store.commit();
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
