// The tiling and online-softmax math of causal attention without T x T in memory (the CUDA
// kernels of core/cuda/attention.cu), host- and device-callable so a float64 test can run the
// same steps on the host against the plain CPU attention (tests/core/attention_tiles_test.cpp).
//
// Queries are cut into tiles of Br rows and keys into tiles of Bc columns; neither needs to
// divide T. Query i sees key j when j <= i (causal) and i < T (a partial last tile's padding
// rows see nothing, so they add nothing to any gradient).
//
// Forward, per query tile: scan the key tiles [0, causal_key_end), keep for every row the running
// maximum m and sum l of exp(s - m) over the visible scores s = scale q.k, rescale the output
// accumulator by advance()'s factor before adding the tile's exp(s - m) v; at the end out = acc / l
// and the saved statistic is lse = m + log l.
// Backward, from lse alone: p = exp(s - lse), delta_i = dout_i . out_i, ds = p (dp - delta) with
// dp = dout_i . v_j; dv_j += sum_i p dout_i, dk_j += scale sum_i ds q_i (per key tile over the
// query tiles from causal_first_query_tile), dq_i += scale sum_j ds k_j (per query tile over its
// key tiles), so each output is summed in one place and in a fixed order.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/kernel_math.h"

namespace core::kmath {

// Whether query i attends to key j in a sequence of T.
ENGINE_HD constexpr bool causal_visible(int64_t i, int64_t j, int64_t T) {
  return i < T && j <= i;
}

// The keys a query tile [r0, r0 + Br) attends to are [0, causal_key_end).
ENGINE_HD constexpr int64_t causal_key_end(int64_t r0, int64_t Br, int64_t T) {
  return r0 + Br < T ? r0 + Br : T;
}

// The first query tile (index, tiles of Br) that sees any key of the tile starting at c0.
ENGINE_HD constexpr int64_t causal_first_query_tile(int64_t c0, int64_t Br) {
  return c0 / Br;
}

// Whether tile (query rows from r0, Br of them; keys from c0, Bc of them) has an element that
// is not visible: it crosses the diagonal or runs past T. Other tiles skip the per-element test.
ENGINE_HD constexpr bool tile_needs_mask(int64_t r0, int64_t Br, int64_t c0, int64_t Bc,
                                         int64_t T) {
  return c0 + Bc - 1 > r0 || r0 + Br > T || c0 + Bc > T;
}

// With a mask (core/ops/attention.h's AttentionMask) query i sees keys [begin_i, i]: `begin` is
// its key_begin (0 without a mask). begin does not decrease along i, so the keys of a query tile
// start in the key tile of its first row's begin, and a key tile that ends before a query tile's
// first begin is invisible to it and to every later query tile (they are skipped whole).
ENGINE_HD constexpr bool masked_visible(int64_t i, int64_t j, int64_t T, int64_t begin) {
  return causal_visible(i, j, T) && j >= begin;
}
// The first key tile (its first key, tiles of Bc) a query tile whose first row begins at
// first_begin scans.
ENGINE_HD constexpr int64_t masked_key_start(int64_t first_begin, int64_t Bc) {
  return first_begin / Bc * Bc;
}
// Whether a tile (keys from c0) needs the per-element test because some of its rows' begins
// (at most last_begin, the begin of its last real row) fall after its first key.
ENGINE_HD constexpr bool begin_needs_mask(int64_t c0, int64_t last_begin) {
  return c0 < last_begin;
}

// One query row's online softmax over the key tiles.
template <typename T>
struct FlashRow {
  T max = -INFINITY;  // the largest visible score so far
  T sum = T(0);       // sum of exp(s - max) over the visible scores so far

  // Moves the running maximum to cover a tile whose visible scores peak at tile_max (-inf when
  // none is visible) and returns the factor the earlier terms are rescaled by: the sum here,
  // the caller's output accumulator with it.
  ENGINE_HD T advance(T tile_max) {
    const T next = tile_max > max ? tile_max : max;
    if (next == T(-INFINITY)) return T(1);  // nothing visible yet: nothing to rescale
    const T alpha = std::exp(max - next);   // 0 the first time (max = -inf)
    max = next;
    sum *= alpha;
    return alpha;
  }
  // The weight of a visible score after advance(); the caller adds it to sum.
  ENGINE_HD T weight(T s) const { return std::exp(s - max); }
  // The statistic the backward recomputes probabilities from.
  ENGINE_HD T log_sum_exp() const { return max + std::log(sum); }
};

// The probability of a visible score, recomputed from its row's log-sum-exp.
template <typename T>
ENGINE_HD inline T attention_prob(T s, T lse) {
  return std::exp(s - lse);
}

// The gradient of a score: p (dp - delta), dp = dout_i . v_j, delta = dout_i . out_i (which
// equals sum_j p_j dp_j).
template <typename T>
ENGINE_HD inline T attention_dscore(T p, T dp, T delta) {
  return p * (dp - delta);
}

}  // namespace core::kmath
