// Elementwise and row-wise math shared by the CPU and CUDA backends.
//
// Every function is a template on the scalar type so the CPU tests can run the same formulas in
// float64 (finite differences) and the CUDA kernels use exactly what those tests cover.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/device.h"

#ifdef __CUDACC__
#define ENGINE_HD __host__ __device__
#else
#define ENGINE_HD
#endif

namespace core::kmath {

// The transcendental functions the formulas below use: the standard library by default (the
// CUDA device versions under nvcc). The CPU backend passes vectorisable float versions
// (cpu/fast_math.h) as the template argument M.
struct StdMath {
  template <typename T>
  ENGINE_HD static T tanh(T x) {
    return std::tanh(x);
  }
  template <typename T>
  ENGINE_HD static T exp(T x) {
    return std::exp(x);
  }
};

// ---- bf16 ------------------------------------------------------------------------------------

// A float's bits and back; memcpy is the bit cast both compilers accept on host and device.
ENGINE_HD inline uint32_t float_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof(u));
  return u;
}
ENGINE_HD inline float float_from_bits(uint32_t u) {
  float x;
  memcpy(&x, &u, sizeof(x));
  return x;
}

// The bf16 nearest to x, ties to even. bf16 is the upper half of a float, so adding 0x7FFF plus
// the lowest kept bit to x's bits carries into the upper half exactly when the dropped half is
// above half a unit of the kept part, or exactly half with the kept part odd. The same carry
// takes a value beyond the largest finite bf16 to infinity, and rounds subnormals correctly
// (their bits order like their values). NaN is taken apart first (the carry could make it
// infinity): it stays NaN, quieted, sign kept. No branch, so loops of it vectorise.
ENGINE_HD inline bf16 bf16_from_float(float x) {
  const uint32_t u = float_bits(x);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x0040u;
  return bf16{static_cast<uint16_t>((u & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded)};
}

// The float a bf16 stands for (exact).
ENGINE_HD inline float float_from_bf16(bf16 b) {
  return float_from_bits(static_cast<uint32_t>(b.bits) << 16);
}

// ---- fp8 ---------------------------------------------------------------------------------------

// The two FP8 formats of the record's head (OCP FP8): e4m3fn (4 exponent bits, bias 7, 3
// mantissa bits, largest 448, no infinity) for the inputs, e5m2 (5, 15, 2, largest 57344) for
// the output gradient.
enum class Fp8 { E4M3, E5M2 };

// The value of the FP8 number nearest x (ties to even), as a float (exact): a value in
// [2^e, 2^(e+1)) a multiple of 2^(e - mantissa bits), below the smallest normal a multiple of
// the subnormal step (2^-9, 2^-16). Beyond the largest finite value it saturates (PTX's
// cvt.rn.satfinite, which the record's compiled casts use); NaN stays NaN.
ENGINE_HD inline float fp8_value(float x, Fp8 format) {
  const bool e4m3 = format == Fp8::E4M3;
  const int mantissa = e4m3 ? 3 : 2, min_exp = e4m3 ? -6 : -14;
  const float largest = e4m3 ? 448.0f : 57344.0f;
  const float a = std::fabs(x);
  if (!(a == a)) return x;
  if (a >= largest) return std::copysign(largest, x);
  // The leading bit of a is 2^(biased exponent - 127) (float subnormals are far below min_exp);
  // the step 2^q and 2^-q are built from their bits, and a 2^-q and its rounding times 2^q are
  // exact (powers of two, |q| < 30).
  const int leading = static_cast<int>((float_bits(a) >> 23) & 0xFFu) - 127;
  const int q = (leading > min_exp ? leading : min_exp) - mantissa;
  const float step = float_from_bits(static_cast<uint32_t>(q + 127) << 23);
  const float inv_step = float_from_bits(static_cast<uint32_t>(127 - q) << 23);
  return std::copysign(std::rint(a * inv_step) * step, x);
}

// The FP8 bits of fp8_value(x, format): sign, exponent field (bias 7 or 15), mantissa. A normal
// value's float exponent and leading mantissa bits are its FP8 fields (re-biased); a subnormal
// one (exponent field 0) is an integer count of the subnormal step. NaN is e4m3fn's single NaN
// code (S.1111.111) or e5m2's quiet NaN (S.11111.11); saturation keeps e5m2 off infinity.
ENGINE_HD inline fp8 fp8_from_float(float x, Fp8 format) {
  const bool e4m3 = format == Fp8::E4M3;
  const int mantissa = e4m3 ? 3 : 2, min_exp = e4m3 ? -6 : -14, bias = e4m3 ? 7 : 15;
  const float v = fp8_value(x, format);
  const uint32_t u = float_bits(v);
  const uint32_t sign = (u >> 24) & 0x80u;
  const float a = std::fabs(v);
  if (!(a == a)) return fp8{static_cast<uint8_t>(sign | 0x7Fu)};
  const int leading = static_cast<int>((u >> 23) & 0xFFu) - 127;
  uint32_t magnitude;
  if (leading >= min_exp) {
    const uint32_t field = static_cast<uint32_t>(leading + bias);
    magnitude = (field << mantissa) | ((u >> (23 - mantissa)) & ((1u << mantissa) - 1u));
  } else {  // a = count * 2^(min_exp - mantissa), count < 2^mantissa (0 for zero)
    const float inv_step = float_from_bits(static_cast<uint32_t>(127 - min_exp + mantissa) << 23);
    magnitude = static_cast<uint32_t>(a * inv_step);
  }
  return fp8{static_cast<uint8_t>(sign | magnitude)};
}

// The scale of a scaled FP8 operand from its amax: max(amax, 1e-12) * factor, factor = headroom
// / 448 for e4m3 (the record's clamp, triton_kernels.py's reduce_mlp_activation_scales). A NaN
// amax stays NaN.
ENGINE_HD inline float fp8_scale_from_amax(float amax, float factor) {
  return (amax < 1e-12f ? 1e-12f : amax) * factor;
}

// The value of FP8 bits (exact). e5m2's all-ones exponent is infinity (mantissa 0) or NaN;
// e4m3fn has no infinity and only S.1111.111 is NaN.
ENGINE_HD inline float float_from_fp8(fp8 b, Fp8 format) {
  const bool e4m3 = format == Fp8::E4M3;
  const int mantissa = e4m3 ? 3 : 2, min_exp = e4m3 ? -6 : -14, bias = e4m3 ? 7 : 15;
  const uint32_t sign = static_cast<uint32_t>(b.bits & 0x80u) << 24;
  const uint32_t field = (b.bits & 0x7Fu) >> mantissa;
  const uint32_t m = b.bits & ((1u << mantissa) - 1u);
  uint32_t magnitude;
  if (e4m3 && (b.bits & 0x7Fu) == 0x7Fu) {
    magnitude = 0x7FC00000u;
  } else if (!e4m3 && field == 31u) {
    magnitude = m == 0 ? 0x7F800000u : 0x7FC00000u;
  } else if (field == 0) {  // subnormal: m steps of 2^(min_exp - mantissa), exact in float
    const float step = float_from_bits(static_cast<uint32_t>(127 + min_exp - mantissa) << 23);
    magnitude = float_bits(static_cast<float>(m) * step);
  } else {
    magnitude = (static_cast<uint32_t>(static_cast<int>(field) - bias + 127) << 23) |
                (m << (23 - mantissa));
  }
  return float_from_bits(sign | magnitude);
}

// ---- activations -------------------------------------------------------------------------------

// sqrt(2 / pi) and the cubic coefficient of the tanh form of GELU.
template <typename T>
ENGINE_HD constexpr T gelu_sqrt_2_over_pi() {
  return T(0.7978845608028654);
}
template <typename T>
ENGINE_HD constexpr T gelu_cubic() {
  return T(0.044715);
}

// gelu(u) = 0.5 u (1 + tanh(s (u + c u^3))).
template <typename M = StdMath, typename T>
ENGINE_HD inline T gelu_tanh(T u) {
  T inner = gelu_sqrt_2_over_pi<T>() * (u + gelu_cubic<T>() * u * u * u);
  return T(0.5) * u * (T(1) + M::tanh(inner));
}

// d gelu / du = 0.5 (1 + th) + 0.5 u (1 - th^2) s (1 + 3 c u^2), th = tanh(s (u + c u^3)).
template <typename M = StdMath, typename T>
ENGINE_HD inline T gelu_tanh_grad(T u) {
  T s = gelu_sqrt_2_over_pi<T>();
  T c = gelu_cubic<T>();
  T th = M::tanh(s * (u + c * u * u * u));
  return T(0.5) * (T(1) + th) + T(0.5) * u * (T(1) - th * th) * s * (T(1) + T(3) * c * u * u);
}

// GELU, exact (erf) form: gelu(u) = 0.5 u (1 + erf(u / sqrt 2)) (PyTorch's F.gelu default; record
// #89's MUDD blocks), derivative 0.5 (1 + erf(u / sqrt 2)) + u exp(-u^2 / 2) / sqrt(2 pi).
template <typename T>
ENGINE_HD inline T gelu_erf(T u) {
  return T(0.5) * u * (T(1) + std::erf(u * T(0.70710678118654752)));
}
template <typename T>
ENGINE_HD inline T gelu_erf_grad(T u) {
  return T(0.5) * (T(1) + std::erf(u * T(0.70710678118654752))) +
         u * std::exp(T(-0.5) * u * u) * T(0.39894228040143268);
}

// The logistic sigmoid 1 / (1 + exp(-u)) and its derivative s (1 - s).
template <typename T>
ENGINE_HD inline T sigmoid(T u) {
  return T(1) / (T(1) + std::exp(-u));
}

// relu2(u) = max(u, 0)^2, derivative 2 max(u, 0).
template <typename T>
ENGINE_HD inline T relu2(T u) {
  T r = u > T(0) ? u : T(0);
  return r * r;
}
template <typename T>
ENGINE_HD inline T relu2_grad(T u) {
  return u > T(0) ? T(2) * u : T(0);
}

// Logit soft-cap z' = cap tanh(z / cap) and dz'/dz = 1 - tanh(z / cap)^2; cap <= 0 is identity.
template <typename M = StdMath, typename T>
ENGINE_HD inline T softcap(T z, T cap) {
  return cap > T(0) ? cap * M::tanh(z / cap) : z;
}
template <typename M = StdMath, typename T>
ENGINE_HD inline T softcap_grad(T z, T cap) {
  if (!(cap > T(0))) return T(1);
  T th = M::tanh(z / cap);
  return T(1) - th * th;
}

// The same derivative from the capped value z' itself: 1 - (z' / cap)^2 (no second tanh).
template <typename T>
ENGINE_HD inline T softcap_grad_from_output(T capped, T cap) {
  if (!(cap > T(0))) return T(1);
  T th = capped / cap;
  return T(1) - th * th;
}

// ---- rotary positions --------------------------------------------------------------------------

// inv_j = base^(-j / half) for the pair (j, j + half), half = hd / 2. `truncated`: the record's
// half-truncated rotary, q = half / 2 pairs at base^(-j / (q - 1)) (torch.linspace's q points
// from 1 down to 1 / base), the other q pairs at 0 (unrotated).
template <typename T>
ENGINE_HD inline T rotary_inv_freq(int64_t j, int64_t half, T base, bool truncated = false) {
  if (!truncated) return std::pow(base, -T(j) / T(half));
  const int64_t q = half / 2;
  return j < q ? std::pow(base, -T(j) / T(q - 1)) : T(0);
}

// Angle of the pair (j, j + half) at position t: t * inv_j.
template <typename T>
ENGINE_HD inline T rotary_angle(int64_t t, int64_t j, int64_t half, T base,
                                bool truncated = false) {
  return T(t) * rotary_inv_freq(j, half, base, truncated);
}

// The frequency of the pair (j, j + half): a table's (record #89's YaRN-rescaled frequencies, a
// [half] array), else rotary_inv_freq's.
template <typename T>
ENGINE_HD inline T rotary_freq(const float* table, int64_t j, int64_t half, T base,
                               bool truncated) {
  return table ? T(table[j]) : rotary_inv_freq(j, half, base, truncated);
}

// The position rotary turns head h of token t at: t, or in record #89's paired-head blocks
// 2t + h mod 2 (train_gpt.py's paired Yarn table: head pair (2p, 2p + 1) of token t at 2t and
// 2t + 1).
ENGINE_HD inline int64_t rotary_position(int64_t t, int64_t h, bool paired) {
  return paired ? 2 * t + h % 2 : t;
}

// Record #89's partial key offset: whether dimension d of a head of hd is one the truncated rotary
// leaves unrotated (pairs (j, j + hd/2) with j >= hd/4), whose key position t takes from t - 1.
ENGINE_HD inline bool key_offset_dim(int64_t d, int64_t hd) {
  return d % (hd / 2) >= hd / 4;
}

// The key offset's element (t, d) of a head [T, hd] at x (the row of position t): forward, the
// key it reads; backward, d of the key it writes from dout's row (the reverse shift, position 0
// also keeping its own).
template <typename T>
ENGINE_HD inline T key_offset_element(const T* row, int64_t t, int64_t d, int64_t T_, int64_t hd,
                                      bool backward) {
  if (!key_offset_dim(d, hd)) return row[d];
  if (!backward) return t > 0 ? row[d - hd] : row[d];
  T g = t + 1 < T_ ? row[d + hd] : T(0);
  if (t == 0) g += row[d];
  return g;
}

// Rotate the pair (x0, x1) = (x_j, x_{j+half}) by the angle with cosine c and sine s:
// x0' = x0 c + x1 s, x1' = -x0 s + x1 c. Passing -s applies the transposed rotation, which is
// the backward of the forward rotation.
template <typename T>
ENGINE_HD inline void rotary_rotate(T& x0, T& x1, T c, T s) {
  T a = x0, b = x1;
  x0 = a * c + b * s;
  x1 = -a * s + b * c;
}

// One pair turned by pos * freq; `inverse` selects the transposed rotation.
template <typename T>
ENGINE_HD inline void rotary_turn(T& x0, T& x1, int64_t pos, T freq, bool inverse) {
  T angle = T(pos) * freq;
  T s = std::sin(angle);
  rotary_rotate(x0, x1, std::cos(angle), inverse ? -s : s);
}

// Both steps for one pair; `inverse` selects the transposed rotation.
template <typename T>
ENGINE_HD inline void rotary_pair(T& x0, T& x1, int64_t t, int64_t j, int64_t half, T base,
                                  bool inverse, bool truncated = false) {
  rotary_turn(x0, x1, t, rotary_inv_freq(j, half, base, truncated), inverse);
}

// ---- attention output corrections (record #89's XSA and output gates) -------------------------
//
// One head's output row y [hd] of a token, its value row v, tau = tanh(alpha) (xsa false: no
// XSA, v not read) and the gate g (1: none): u = y - tau c v with c = y.v / m, m = max(|v|^2, 1e-8)
// (XSA removes the fraction tau of y along v), and the output g u.

ENGINE_HD inline float widen(float x) {
  return x;
}
ENGINE_HD inline float widen(bf16 x) {
  return float_from_bf16(x);
}
ENGINE_HD inline void store_as(float& dst, float x) {
  dst = x;
}
ENGINE_HD inline void store_as(bf16& dst, float x) {
  dst = bf16_from_float(x);
}

constexpr float kXsaMinNormSq = 1e-8f;

// c = y.v / m and m = max(|v|^2, 1e-8); `clamped` whether |v|^2 was below the floor.
template <typename Y>
ENGINE_HD inline float xsa_coefficient(const Y* y, const float* v, int64_t hd, float& m,
                                       bool& clamped) {
  float dot = 0.0f, vv = 0.0f;
  for (int64_t d = 0; d < hd; ++d) {
    dot += widen(y[d]) * v[d];
    vv += v[d] * v[d];
  }
  clamped = !(vv > kXsaMinNormSq);
  m = clamped ? kXsaMinNormSq : vv;
  return dot / m;
}

// out = g (y - tau c v) for one row.
template <typename Y, typename O>
ENGINE_HD inline void attention_out_row_forward(O* out, const Y* y, const float* v, int64_t hd,
                                                bool xsa, float tau, float g) {
  float m = 1.0f;
  bool clamped = false;
  const float c = xsa ? xsa_coefficient(y, v, hd, m, clamped) : 0.0f;
  for (int64_t d = 0; d < hd; ++d)
    store_as(out[d], g * (xsa ? widen(y[d]) - tau * c * v[d] : widen(y[d])));
}

// Its backward from dz = d out (xsa: v and tau are read): dy written (=), dv added (+=), and
// d tau, d g returned:
// du = g dz, dg = dz.u, s = du.v, dy = du - tau (s / m) v, d tau = -c s,
// dv = -tau (c du + (s / m) y - 2 (s c / m) v [|v|^2 above the floor]).
template <typename Y>
ENGINE_HD inline void attention_out_row_backward(float* dy, float* dv, float& dtau, float& dg,
                                                 const float* dz, const Y* y, const float* v,
                                                 int64_t hd, bool xsa, float tau, float g) {
  float m = 1.0f;
  bool clamped = false;
  const float c = xsa ? xsa_coefficient(y, v, hd, m, clamped) : 0.0f;
  float s = 0.0f, gsum = 0.0f;
  for (int64_t d = 0; d < hd; ++d) {
    const float yd = widen(y[d]);
    gsum += dz[d] * (xsa ? yd - tau * c * v[d] : yd);
    if (xsa) s += g * dz[d] * v[d];
  }
  dg = gsum;
  dtau = -c * s;
  const float sm = s / m;
  const float vterm = clamped ? 0.0f : 2.0f * sm * c;
  for (int64_t d = 0; d < hd; ++d) {
    const float du = g * dz[d];
    if (!xsa) {
      dy[d] = du;
      continue;
    }
    dy[d] = du - tau * sm * v[d];
    dv[d] += -tau * (c * du + sm * widen(y[d]) - vterm * v[d]);
  }
}

// ---- row statistics ----------------------------------------------------------------------------

// 1 / sqrt(x + eps): eps inside the square root, as the spec's norms require.
template <typename T>
ENGINE_HD inline T rsqrt_eps(T x, T eps) {
  return T(1) / std::sqrt(x + eps);
}

// Online softmax normaliser: running max m and sum of exp(x - m); merge() combines partials.
template <typename T>
struct OnlineSoftmax {
  T max = -INFINITY;
  T sum = T(0);

  ENGINE_HD void add(T x) {
    if (x == T(-INFINITY)) return;  // contributes exp(-inf) = 0
    if (x > max) {
      sum = sum * std::exp(max - x) + T(1);
      max = x;
    } else {
      sum += std::exp(x - max);
    }
  }
  ENGINE_HD void merge(const OnlineSoftmax& o) {
    if (o.max == T(-INFINITY)) return;
    if (o.max > max) {
      sum = sum * std::exp(max - o.max) + o.sum;
      max = o.max;
    } else {
      sum += o.sum * std::exp(o.max - max);
    }
  }
  // log sum exp of everything added.
  ENGINE_HD T log_sum_exp() const { return max + std::log(sum); }
};

// ---- model: loss reduction, MoE routing ---------------------------------------------------------

// A mean from its float64 sum, rounded once to T (the mean cross-entropy over n rows).
template <typename T>
ENGINE_HD inline T mean_from_sum(double sum, int64_t n) {
  return static_cast<T>(sum / static_cast<double>(n));
}

// The K most probable of one token's expert probabilities p[E] into chosen[K], most probable
// first, ties to the lower expert index (the order of a sort by (p descending, index
// ascending)). Returns the sum of the chosen probabilities, added in slot order. Needs K <= E.
template <typename T>
ENGINE_HD inline T moe_top_k(const T* p, int64_t E, int64_t K, int32_t* chosen) {
  T sum = T(0);
  for (int64_t s = 0; s < K; ++s) {
    int32_t best = -1;
    for (int32_t e = 0; e < static_cast<int32_t>(E); ++e) {
      bool taken = false;
      for (int64_t j = 0; j < s; ++j)
        taken = taken || chosen[j] == e;
      // Strictly greater: among equal probabilities the first (lowest) index stays.
      if (!taken && (best < 0 || p[e] > p[best])) best = e;
    }
    chosen[s] = best;
    sum += p[best];
  }
  return sum;
}

// Renormalised gate of a chosen expert: its probability over the sum of the chosen ones.
template <typename T>
ENGINE_HD inline T moe_gate(T p, T chosen_sum) {
  return p / chosen_sum;
}

// f_e = (tokens routed to e) / N.
template <typename T>
ENGINE_HD inline T moe_fraction(int64_t count, int64_t N) {
  return static_cast<T>(count) / static_cast<T>(N);
}

// One expert's term of the balance sum_e f_e P_e, in float64: P_e = mass_e / N is the mean
// probability of e (mass_e its float64 sum over the tokens).
template <typename T>
ENGINE_HD inline double moe_balance_term(T frac, double mass, int64_t N) {
  return static_cast<double>(frac) * (mass / static_cast<double>(N));
}

// The auxiliary loss aux_weight * E * balance, rounded once to T.
template <typename T>
ENGINE_HD inline T moe_aux_loss(T aux_weight, int64_t E, double balance) {
  return static_cast<T>(aux_weight * static_cast<T>(E) * balance);
}

// d aux / d p[t, e] = aux_weight * E / N * f_e, with f_e held constant (it is piecewise
// constant in p); this is the factor of f_e.
template <typename T>
ENGINE_HD inline T moe_aux_grad_scale(T aux_weight, int64_t E, int64_t N) {
  return aux_weight * static_cast<T>(E) / static_cast<T>(N);
}

// The router gradient of one token, accumulated into its row dp[E] of d objective / d probs:
// the aux loss's aux_scale * f_e for every expert, then through the gates g_s = p_{c_s} / S
// (S = sum of the chosen p): d/dp_{c_s} = (dg_s - sum_j dg_j g_j) / S. Slot s of the token
// has expert chosen[s] and dispatch row slot_row[s]; dgate and gate are indexed by row.
template <typename T>
ENGINE_HD inline void moe_router_grad(T* dp, const T* frac, T aux_scale, int64_t E,
                                      const int32_t* chosen, const int32_t* slot_row,
                                      const T* dgate, const T* gate, T chosen_sum, int64_t K) {
  for (int64_t e = 0; e < E; ++e)
    dp[e] += aux_scale * frac[e];
  T weighted = T(0);  // sum_s dg_s g_s
  for (int64_t s = 0; s < K; ++s)
    weighted += dgate[slot_row[s]] * gate[slot_row[s]];
  for (int64_t s = 0; s < K; ++s)
    dp[chosen[s]] += (dgate[slot_row[s]] - weighted) / chosen_sum;
}

// ---- model: record #89's input side (bigram hash embedding, smear) -----------------------------

// The record's bigram hash (train_gpt.py get_bigram_hash) of one position from its token
// `current` and the token before it (`previous`; the record uses m itself at t = 1, and h[0] = m
// is the reserved last row): ((36313 current) XOR (27191 previous)) mod m, m = table rows - 1.
// The products wrap as int32 (torch's int32 tensors; computed in uint32, where overflow is
// defined) and the remainder takes the divisor's sign (torch.remainder): in [0, m).
inline constexpr int32_t kBigramMulCurrent = 36313;
inline constexpr int32_t kBigramMulPrevious = 27191;

ENGINE_HD inline int32_t mul_wrap_i32(int32_t a, int32_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(a) * static_cast<uint32_t>(b));
}

ENGINE_HD inline int32_t bigram_hash(int32_t current, int32_t previous, int32_t m) {
  const int32_t mixed =
      mul_wrap_i32(kBigramMulCurrent, current) ^ mul_wrap_i32(kBigramMulPrevious, previous);
  const int32_t r = mixed % m;
  return r < 0 ? r + m : r;
}

// The hash of position t of a row whose tokens start at `row`: m at t = 0, the previous token
// taken as m at t = 1 (the record overwrites x[0] with m before the products).
ENGINE_HD inline int32_t bigram_hash_at(const int32_t* row, int64_t t, int32_t m) {
  if (t == 0) return m;
  return bigram_hash(row[t], t == 1 ? m : row[t - 1], m);
}

// The row of the bigram sign table position t of a row reads: (x[t-1] XOR x[t]) mod rows for
// t >= 1 (token ids are non-negative), row 0 at t = 0.
ENGINE_HD inline int64_t bigram_sign_row(const int32_t* row, int64_t t, int64_t rows) {
  return t == 0 ? 0 : static_cast<int64_t>(row[t - 1] ^ row[t]) % rows;
}

// The smear's gate of a position t >= 1: lambda sigmoid(z), z = x[t, :K] . w (record #34's
// smear_gate; sigmoid above). Its derivative in z: lambda sigmoid(z) (1 - sigmoid(z)), from
// s = sigmoid(z).
template <typename T>
ENGINE_HD inline T smear_gate_grad_z(T lambda, T s) {
  return lambda * s * (T(1) - s);
}

// ---- model: the training loss's terms (record #89's multi-token and prefix targets) -------------

// The terms of the loss at position n of the N = B T rows of logits (t = n mod row_tokens, the
// position in its row): offset k < offsets predicts targets[n + k], the token k + 1 places on,
// with weight[k], and is a term only while t + k < row_tokens (no document masking; nothing
// crosses a row); the prefix term predicts prefix_of[targets[n]] (the longest proper byte prefix
// of the next token that is itself a token; -1: no term) with prefix_weight. A position's loss
// is sum_i w_i (lse - z[target_i]) over its terms; its gradient in z_j is
// (sum_i w_i) softmax(z)_j - (the weights of the terms whose target is j): the exact gradient of
// that loss, also on a row's last positions where later offsets have no term (record #89's kernel
// normalises those over all the weights: not its loss's gradient; the engine does not copy it).
// The plain cross-entropy: offsets 1, weight {1}, no prefix table.
struct LossTerms {
  static constexpr int kMaxOffsets = 4;
  static constexpr int kMaxTerms = kMaxOffsets + 1;  // the offsets and the prefix
  int offsets = 1;
  float weight[kMaxOffsets] = {1.0f, 0.0f, 0.0f, 0.0f};
  int64_t row_tokens = 1;
  const int32_t* prefix_of = nullptr;  // [vocabulary] on the device, or null: no prefix term
  float prefix_weight = 0.0f;
};

// One position's terms: their targets (-1: no term) and weights, and the weights' sum.
template <typename T>
struct PositionTerms {
  int32_t target[LossTerms::kMaxTerms];
  T weight[LossTerms::kMaxTerms];
  T total;
};

// targets[n] outside [0, V) reads no prefix (the kernels report such a target).
template <typename T>
ENGINE_HD inline PositionTerms<T> position_terms(const LossTerms& terms, const int32_t* targets,
                                                 int64_t n, int64_t V) {
  PositionTerms<T> p;
  p.total = T(0);
  const int64_t t = n % terms.row_tokens;
  for (int k = 0; k < LossTerms::kMaxOffsets; ++k) {
    const bool present = k < terms.offsets && t + k < terms.row_tokens;
    p.target[k] = present ? targets[n + k] : -1;
    p.weight[k] = present ? static_cast<T>(terms.weight[k]) : T(0);
    p.total += p.weight[k];
  }
  const int i = LossTerms::kMaxOffsets;  // the prefix term
  const int32_t next = targets[n];
  p.target[i] = terms.prefix_of != nullptr && next >= 0 && next < V ? terms.prefix_of[next] : -1;
  p.weight[i] = p.target[i] >= 0 ? static_cast<T>(terms.prefix_weight) : T(0);
  p.total += p.weight[i];
  return p;
}

// The weight of the terms whose target is column j.
template <typename T>
ENGINE_HD inline T target_weight(const PositionTerms<T>& p, int64_t j) {
  T w = T(0);
  for (int i = 0; i < LossTerms::kMaxTerms; ++i)
    if (p.target[i] == j) w += p.weight[i];
  return w;
}

// d (the position's loss) / d z_j from softmax(z)_j: total p_j - target_weight(j), formed before
// any scaling so that a likely target (p near its weight's share) does not cancel after it.
template <typename T>
ENGINE_HD inline T terms_grad(T p, T total, T weight_of_j) {
  return total * p - weight_of_j;
}

// ---- float updates and column math --------------------------------------------------------------
//
// Float arithmetic in a fixed operation order, so the CPU results are reproducible bits; sums of
// squares and dot products run in float64.

// torch.lerp's two-branch form: a + w (b - a) for w < 0.5, else b - (b - a)(1 - w).
ENGINE_HD inline float lerp(float a, float b, float w) {
  return w < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w);
}

// y + a x in float (a decay y + alpha y, an L2 term g + wd p, a step p - lr d).
ENGINE_HD inline float add_scaled(float y, float a, float x) {
  return y + a * x;
}

// sum_i a[i, j] b[i, j] for column j of a, b [rows, cols], in float64 in row order.
ENGINE_HD inline float column_dot(const float* a, const float* b, int64_t rows, int64_t cols,
                                  int64_t j) {
  double s = 0;
  for (int64_t i = 0; i < rows; ++i)
    s += static_cast<double>(a[i * cols + j]) * b[i * cols + j];
  return static_cast<float>(s);
}

// The factor the summed gradients are scaled by: `mean` (1 / (ranks x micro-steps), the sums'
// mean) times the clip, max_norm / (norm + 1e-6) where the mean gradient's norm
// sqrt(sum_squares) mean exceeds max_norm > 0. The clip is rounded to float first, then the
// product, as the host computed it when it read the norm back.
ENGINE_HD inline float grad_clip_scale(double sum_squares, double mean, double max_norm) {
  const double norm = std::sqrt(sum_squares) * mean;
  float clip = 1.0f;
  if (max_norm > 0 && norm > max_norm) clip = static_cast<float>(max_norm / (norm + 1e-6));
  return static_cast<float>(mean * clip);
}

// The descending order of the eigenvalue sort: larger first, a NaN after every number (so the
// order is a strict weak ordering and any input sorts into a permutation).
ENGINE_HD inline bool sorts_before_descending(float a, float b) {
  return a > b || (b != b && a == a);
}

// The position of element j of x [n] in the stable descending sort: the elements that sort
// before it, plus the equivalent ones of lower index.
ENGINE_HD inline int64_t descending_rank(const float* x, int64_t n, int64_t j) {
  int64_t rank = 0;
  for (int64_t i = 0; i < n; ++i)
    if (sorts_before_descending(x[i], x[j]) || (i < j && !sorts_before_descending(x[j], x[i])))
      ++rank;
  return rank;
}

// Whether column j of q [rows, cols] is to be negated for the sign convention: its entry of
// largest magnitude (the lowest row on ties) is negative.
ENGINE_HD inline bool column_sign_flips(const float* q, int64_t rows, int64_t cols, int64_t j) {
  float best = 0.0f, value = 0.0f;
  for (int64_t i = 0; i < rows; ++i) {
    const float x = q[i * cols + j];
    const float a = x < 0.0f ? -x : x;
    if (a > best) {
      best = a;
      value = x;
    }
  }
  return value < 0.0f;
}

}  // namespace core::kmath
