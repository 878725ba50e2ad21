// The CPU classifier kernels: the soft-capped cross-entropy with its logits' gradient, and the
// loss reductions in float64.
// Templated on the scalar type: the backend instantiates them for float, the tests also for
// double (central finite differences); the element math is core/kernel_math.h's.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "core/cpu/bf16_rounding.h"
#include "core/cpu/fast_math.h"
#include "core/cpu/parallel_loops.h"
#include "core/device.h"
#include "core/kernel_math.h"

namespace core::cpu {

// An element of the d logits output: T itself, or bf16 rounded once (bf16 precision).
template <typename G, typename T>
G gradient_as(T g) {
  if constexpr (std::is_same_v<G, bf16>) {
    return kmath::bf16_from_float(static_cast<float>(g));
  } else {
    return g;
  }
}

// kmath::softcap as the CPU computes it (the GPU takes tanhf), vectorisable: a capped logit
// z = cap tanh(x / cap) from one exponential, tanh(y) = 1 - 2 / (exp(2y) + 1),
// which FastMath::exp's range takes to +-1 at its ends (exp 0 or inf) and NaN keeps NaN. Its
// error is absolute, a few roundings of 1 times cap, also near 0 where FastMath::tanh's
// polynomial would keep it relative: z only enters exp(z - max) and 1 - (z / cap)^2, whose
// errors are z's absolute one. No select of its own: GCC turns each select of a vectorised loop
// into AVX-512 mask operations, which cost more than the arithmetic here (the tanh pass of the
// capped classifier: 33 -> 15 ms for GPT-2's 1024 x 50257 logits, one Zen 5 core, CPU time).
template <typename T>
inline T capped_logit(T x, T cap, T inv_cap) {
  return cap * (T(1) - T(2) / (FastMath::exp(T(2) * (x * inv_cap)) + T(1)));
}

// Per row: z = softcap(logits[:V]), loss = sum_i w_i (logsumexp(z) - z[target_i]) over the row's
// terms (kmath::position_terms; the plain cross-entropy's one term is lse - z[target]);
// dlogits = dloss_scale (W softmax(z) - c) softcap'(logits) with W the terms' total weight and
// c_j the weight of those targeting j, zero in the padded columns, as T or as bf16 (G). The logits
// are T, or bf16 (L) widened exactly. Two exponentials per element with a cap (capped_logit's and
// softmax's), one without: z goes to a per-thread row buffer, exp(z - max) to dlogits (T) or a
// second row buffer (bf16). dlogits may alias logits: every logit of a row is read (into the
// buffer) before anything of the row is written. The cap's test sits outside the loops, since a
// vectorised loop computes both sides of a test inside it (bench_model --op-groups: the
// classifier about 2x faster without the cap); the target columns are written once more after
// the row's vectorised pass.
template <typename T, typename G, typename L = T>
void cross_entropy(T* losses, G* dlogits, const L* logits, const int32_t* targets, int64_t N,
                   int64_t V, int64_t Vp, T softcap, T dloss_scale, const kmath::LossTerms& terms) {
  ENGINE_CHECK(V > 0 && V <= Vp, "cross_entropy: need 0 < V <= Vp, got V=" + std::to_string(V) +
                                     " Vp=" + std::to_string(Vp));
  ENGINE_CHECK(terms.offsets >= 1 && terms.offsets <= kmath::LossTerms::kMaxOffsets &&
                   terms.row_tokens >= 1 && N % terms.row_tokens == 0,
               "cross_entropy: " + std::to_string(terms.offsets) + " offsets (1.." +
                   std::to_string(kmath::LossTerms::kMaxOffsets) + ") over rows of " +
                   std::to_string(terms.row_tokens) + " of the " + std::to_string(N) +
                   " positions");
  for (int64_t n = 0; n < N; ++n) {
    if (targets[n] < 0 || targets[n] >= V) {
      ENGINE_FAIL("cross_entropy: target " + std::to_string(targets[n]) + " at row " +
                  std::to_string(n) + " is outside [0, V=" + std::to_string(V) + ")");
    }
    if (terms.prefix_of && terms.prefix_of[targets[n]] >= V) {
      ENGINE_FAIL("cross_entropy: the prefix " + std::to_string(terms.prefix_of[targets[n]]) +
                  " of target " + std::to_string(targets[n]) + " at row " + std::to_string(n) +
                  " is outside [0, V=" + std::to_string(V) + ")");
    }
  }
  // The exponentials are kept in the output row itself when it holds T (it may alias the
  // logits: each row is read into z first), else in a scratch row.
  constexpr bool in_place = std::is_same_v<G, T>;
  const bool capped = softcap > T(0);
  const T inv_cap = capped ? T(1) / softcap : T(0);
  static_assert(std::is_same_v<L, T> || (std::is_same_v<L, bf16> && std::is_same_v<G, bf16>),
                "logits are T, or bf16 with bf16 d logits (bf16 precision)");
#pragma omp parallel if (N * V > kParallelMin)
  {
    std::vector<T> z(static_cast<size_t>(V));
    std::vector<T> scratch(in_place ? 0 : static_cast<size_t>(V));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const L* x = logits + n * Vp;
      if (capped) {
#pragma omp simd
        for (int64_t j = 0; j < V; ++j)
          z[j] = capped_logit(widen<T>(x[j]), softcap, inv_cap);
      } else {
#pragma omp simd
        for (int64_t j = 0; j < V; ++j)
          z[j] = widen<T>(x[j]);
      }
      T mx = row_max(z.data(), V);
      const kmath::PositionTerms<T> pos = kmath::position_terms<T>(terms, targets, n, V);
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
      if (losses) {
        T loss = T(0);
        for (int i = 0; i < kmath::LossTerms::kMaxTerms; ++i)
          if (pos.target[i] >= 0) loss += pos.weight[i] * (lse - z[pos.target[i]]);
        losses[n] = loss;
      }
      if (g) {
        T inv = T(1) / s;
        // The targets' probabilities, read before their columns are overwritten.
        T p_target[kmath::LossTerms::kMaxTerms];
        for (int i = 0; i < kmath::LossTerms::kMaxTerms; ++i)
          p_target[i] = pos.target[i] >= 0 ? e[pos.target[i]] * inv : T(0);
        const T total = pos.total;
        if (capped) {
#pragma omp simd
          for (int64_t j = 0; j < V; ++j) {
            g[j] = gradient_as<G>(dloss_scale * total * e[j] * inv *
                                  kmath::softcap_grad_from_output(z[j], softcap));
          }
        } else {  // softcap_grad_from_output is 1: the same products
#pragma omp simd
          for (int64_t j = 0; j < V; ++j)
            g[j] = gradient_as<G>(dloss_scale * total * e[j] * inv * T(1));
        }
        // The target columns: total p - c (a column several terms target is written alike by each).
        for (int i = 0; i < kmath::LossTerms::kMaxTerms; ++i) {
          const int32_t j = pos.target[i];
          if (j < 0) continue;
          g[j] = gradient_as<G>(
              dloss_scale * kmath::terms_grad(p_target[i], total, kmath::target_weight(pos, j)) *
              kmath::softcap_grad_from_output(z[j], softcap));
        }
        for (int64_t j = V; j < Vp; ++j)
          g[j] = gradient_as<G>(T(0));
      }
    }
  }
}

// The plain cross-entropy: one target a row.
template <typename T, typename G, typename L = T>
void cross_entropy(T* losses, G* dlogits, const L* logits, const int32_t* targets, int64_t N,
                   int64_t V, int64_t Vp, T softcap, T dloss_scale) {
  cross_entropy(losses, dlogits, logits, targets, N, V, Vp, softcap, dloss_scale,
                kmath::LossTerms{});
}

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

}  // namespace core::cpu
