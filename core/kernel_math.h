// Elementwise and row-wise math shared by the CPU and CUDA backends.
//
// Every function is a template on the scalar type so the CPU tests can run the same formulas in
// float64 (finite differences) and the CUDA kernels use exactly what those tests cover.
#pragma once

#include <cmath>
#include <cstdint>

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

// inv_j = base^(-j / half) for the pair (j, j + half), half = hd / 2.
template <typename T>
ENGINE_HD inline T rotary_inv_freq(int64_t j, int64_t half, T base) {
  return std::pow(base, -T(j) / T(half));
}

// Angle of the pair (j, j + half) at position t: t * inv_j.
template <typename T>
ENGINE_HD inline T rotary_angle(int64_t t, int64_t j, int64_t half, T base) {
  return T(t) * rotary_inv_freq(j, half, base);
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

// Both steps for one pair; `inverse` selects the transposed rotation.
template <typename T>
ENGINE_HD inline void rotary_pair(T& x0, T& x1, int64_t t, int64_t j, int64_t half, T base,
                                  bool inverse) {
  T angle = rotary_angle(t, j, half, base);
  T s = std::sin(angle);
  rotary_rotate(x0, x1, std::cos(angle), inverse ? -s : s);
}

// ---- row statistics ----------------------------------------------------------------------------

// Welford's running mean and sum of squared deviations; merge() combines two partial states
// (Chan et al.), so a row can be reduced in parallel pieces.
template <typename T>
struct Welford {
  T mean = T(0);
  T m2 = T(0);
  T count = T(0);

  ENGINE_HD void add(T x) {
    count += T(1);
    T delta = x - mean;
    mean += delta / count;
    m2 += delta * (x - mean);
  }
  ENGINE_HD void merge(const Welford& o) {
    if (o.count == T(0)) return;
    T n = count + o.count;
    T delta = o.mean - mean;
    mean += delta * o.count / n;
    m2 += o.m2 + delta * delta * count * o.count / n;
    count = n;
  }
  // Population variance (LayerNorm divides by C, not C - 1).
  ENGINE_HD T variance() const { return count > T(0) ? m2 / count : T(0); }
};

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

// ---- optimizer helpers -------------------------------------------------------------------------

// Adam moments: m <- b1 m + (1 - b1) g, v <- b2 v + (1 - b2) g^2.
template <typename T>
ENGINE_HD inline void adam_moments(T& m, T& v, T g, T beta1, T beta2) {
  m = beta1 * m + (T(1) - beta1) * g;
  v = beta2 * v + (T(1) - beta2) * g * g;
}

// Bias-corrected Adam direction m_hat / (sqrt(v_hat) + eps), with bc1 = 1 - b1^t and
// bc2 = 1 - b2^t precomputed by the caller.
template <typename T>
ENGINE_HD inline T adam_direction(T m, T v, T bc1, T bc2, T eps) {
  return (m / bc1) / (std::sqrt(v / bc2) + eps);
}

// ---- fused optimizer updates (Backend "optimizer updates") --------------------------------------
//
// The stored values are float, the arithmetic float64: each element's trajectory is the float64
// one rounded once per step, like the golden files. The operation order below is the order the
// golden replays were recorded with; changing it changes CPU trajectories bit for bit.

// The scalars of one AdamW step of one tensor, computed on the host from the step count t with
// bc1 = 1 - b1^t, bc2 = 1 - b2^t:
//   spec eps:  step_size = lr sqrt(bc2) / bc1, v_scale = 1
//   torch eps: step_size = lr / bc1,           v_scale = 1 / sqrt(bc2)
//   decoupled weight decay: decay = 1 - lr wd, cautious = 0
//   cautious weight decay:  decay = 1,         cautious = lr^2 wd
struct AdamWStep {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double step_size = 0;
  double v_scale = 1;
  double decay = 1;
  double cautious = 0;
};

// One AdamW element: the moments, then u = step_size m / (sqrt(v) v_scale + eps), plus the
// cautious decay cautious * w only where it agrees in sign with the step (u w > 0), and
// w <- w decay - u.
ENGINE_HD inline void adamw_element(float& w, float& m, float& v, float g, const AdamWStep& s) {
  const double gi = g;
  double mi = m, vi = v;
  adam_moments(mi, vi, gi, s.beta1, s.beta2);
  m = static_cast<float>(mi);
  v = static_cast<float>(vi);
  const double wi = w;
  double u = s.step_size * mi / (std::sqrt(vi) * s.v_scale + s.eps);
  u += u * wi > 0 ? s.cautious * wi : 0.0;
  w = static_cast<float>(wi * s.decay - u);
}

// NorMuon normalisation of one orthogonalised update V [rows, cols]: with one statistic per row
// (rows >= cols) or per column, q_a the sum of squares of row (column) a over its `count`
// entries and s_a the stored second moment,
//   s_a <- b2 s_a + (1 - b2) q_a / count,   scale_a = 1 / sqrt(max(s_a, 1e-10)),
//   V   <- V * scale (per row or column) * ||V||_F / max(||V * scale||_F, 1e-10),
// so the update keeps its Frobenius norm and only its distribution over rows (columns) changes.
ENGINE_HD inline double normuon_second_moment(double s, double q, double count, double beta2) {
  return beta2 * s + (1.0 - beta2) * (q / count);
}
ENGINE_HD inline double normuon_scale(double second_moment) {
  return 1.0 / std::sqrt(second_moment < 1e-10 ? 1e-10 : second_moment);
}
// ||V||_F / max(||V * scale||_F, 1e-10) from the two squared norms.
ENGINE_HD inline double normuon_keep_norm(double norm2, double scaled2) {
  const double scaled = std::sqrt(scaled2);
  return std::sqrt(norm2) / (scaled < 1e-10 ? 1e-10 : scaled);
}
ENGINE_HD inline float normuon_apply(float v, double scale, double keep_norm) {
  return static_cast<float>(v * scale * keep_norm);
}

// The Muon parameter update with cautious weight decay: w <- w - lr (wd [u w >= 0] w + u); the
// decay acts only where it agrees in sign with the update (wd = 0: the plain update).
ENGINE_HD inline float cautious_update_element(float w, float u, double lr, double wd) {
  const double wi = w, ui = u;
  const double mask = ui * wi >= 0 ? 1.0 : 0.0;
  return static_cast<float>(wi - lr * (wd * mask * wi + ui));
}

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

// ---- SOAP family (optim/soap.cpp, eigenbasis.cpp, tp_rekls.cpp) --------------------------------
//
// Float arithmetic in the operation order of the SOAP reference (and of the host loops the golden
// files were replayed with before these operations existed): on the CPU the results are those
// bits. Sums of squares and dot products run in float64.

// torch.lerp's two-branch form: a + w (b - a) for w < 0.5, else b - (b - a)(1 - w).
ENGINE_HD inline float soap_lerp(float a, float b, float w) {
  return w < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w);
}

// y + a x in float (the reference's fused add: decay P + alpha P, l2 G + wd P, step P - lr D).
ENGINE_HD inline float soap_add_scaled(float y, float a, float x) {
  return y + a * x;
}

// KL-Shampoo's weight of an eigen direction of a factor of size n: 1 / n / max(lam, eps) in
// float64, rounded to float (C = Q diag(weights) Q^T). The max is std::max's (a NaN stays).
ENGINE_HD inline float kl_inverse_weight(float lam, double eps, int64_t n) {
  const double l = static_cast<double>(lam);
  return static_cast<float>(1.0 / static_cast<double>(n) / (l < eps ? eps : l));
}

// sum_i a[i, j] b[i, j] for column j of a, b [rows, cols], in float64 in row order.
ENGINE_HD inline float column_dot(const float* a, const float* b, int64_t rows, int64_t cols,
                                  int64_t j) {
  double s = 0;
  for (int64_t i = 0; i < rows; ++i)
    s += static_cast<double>(a[i * cols + j]) * b[i * cols + j];
  return static_cast<float>(s);
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

// The scalars of one Adam step in the eigenbasis (spec section 1.2, step k = t + 1):
//   raw (adam_eps: raw):  m <- b1 m + (1 - b1) g, v <- b2 v + (1 - b2) g^2, d = m / (sqrt(v) + eps)
//   corrected:            m <- lerp(m, g, w1), v <- lerp(v, g^2, w2),
//                         d = n / (sqrt(v / c2) + eps), n = m / c1, or with nesterov
//                         n = b1 m / cn + (1 - b1) g / c1
// with w1 = float(1 - beta1), w2 = float(1 - beta2) (formed in float64), c1 = 1 - b1^k,
// c2 = 1 - b2^k, cn = 1 - b1^(k+1) (1 without bias correction).
struct SoapAdamStep {
  bool raw = false;
  bool nesterov = false;
  float beta1 = 0.9f, beta2 = 0.95f;
  float w1 = 0.1f, w2 = 0.05f;
  float eps = 1e-8f;
  float c1 = 1, c2 = 1, cn = 1;
};

ENGINE_HD inline float soap_adam_raw(float& m, float& v, float g, const SoapAdamStep& s) {
  m = s.beta1 * m + (1.0f - s.beta1) * g;
  v = s.beta2 * v + (1.0f - s.beta2) * g * g;
  return m / (std::sqrt(v) + s.eps);
}

// g2 is g * g rounded to float, formed apart from the lerp (as the reference stores it).
ENGINE_HD inline float soap_adam_corrected(float& m, float& v, float g, float g2,
                                           const SoapAdamStep& s) {
  m = soap_lerp(m, g, s.w1);
  v = soap_lerp(v, g2, s.w2);
  const float num = s.nesterov ? s.beta1 * m / s.cn + (1.0f - s.beta1) * g / s.c1 : m / s.c1;
  return num / (std::sqrt(v / s.c2) + s.eps);
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

// The max_update_rms clip factor min(1, max_rms / (rms + 1e-7)) of an update of n elements with
// float64 sum of squares ss, rounded to float.
ENGINE_HD inline float soap_rms_clip_scale(double ss, int64_t n, double max_rms) {
  const double rms = std::sqrt(ss / static_cast<double>(n));
  const double s = max_rms / (rms + 1e-7);
  return static_cast<float>(s < 1.0 ? s : 1.0);
}

// ---- OSFT (optim/osft*.cpp, engine/osft_reparam.cpp) -----------------------------------------
// One output element of each OSFT product (docs/specs/osft.md): a target W [n, m] is held as
// U_high diag(S_high) V_high + U_low diag(S_low) V_low with U_* [n, k|r], S_* [k|r] and
// V_* [k|r, m], all row-major. Every sum runs in float64 over float inputs and is rounded once.
// The CUDA kernels evaluate these; the CPU backend forms the same float64 products with Eigen's
// GEMM (so its results stay those of the host code before the backends had OSFT ops) and the CPU
// tests check these formulas against it.

// W[i, j] = sum_l (U_high[i, l] S_high[l]) V_high[l, j] + sum_l (U_low[i, l] S_low[l]) V_low[l, j].
ENGINE_HD inline float osft_dense_element(const float* u_high, const float* s_high,
                                          const float* v_high, const float* u_low,
                                          const float* s_low, const float* v_low, int64_t m,
                                          int64_t k, int64_t r, int64_t i, int64_t j) {
  double high = 0, low = 0;
  for (int64_t l = 0; l < k; ++l)
    high += (static_cast<double>(u_high[i * k + l]) * s_high[l]) * v_high[l * m + j];
  for (int64_t l = 0; l < r; ++l)
    low += (static_cast<double>(u_low[i * r + l]) * s_low[l]) * v_low[l * m + j];
  return static_cast<float>(high + low);
}

// (dW V_low^T)[i, j] = sum_c dW[i, c] V_low[j, c], the product both U_low's and S_low's chain
// rule read.
ENGINE_HD inline double osft_dw_v(const float* dw, const float* v_low, int64_t m, int64_t i,
                                  int64_t j) {
  double sum = 0;
  for (int64_t c = 0; c < m; ++c)
    sum += static_cast<double>(dw[i * m + c]) * v_low[j * m + c];
  return sum;
}

// dU_low[i, j] = (dW V_low^T)[i, j] S_low[j].
ENGINE_HD inline float osft_grad_u_element(const float* dw, const float* v_low, const float* s_low,
                                           int64_t m, int64_t i, int64_t j) {
  return static_cast<float>(osft_dw_v(dw, v_low, m, i, j) * s_low[j]);
}

// dS_low[j] = sum_i U_low[i, j] (dW V_low^T)[i, j] (u_j^T dW v_j): term i, and the sum of the
// terms in row order (the CUDA kernel sums the terms of one j in a fixed block order instead).
ENGINE_HD inline double osft_grad_s_term(const float* dw, const float* u_low, const float* v_low,
                                         int64_t m, int64_t r, int64_t i, int64_t j) {
  return static_cast<double>(u_low[i * r + j]) * osft_dw_v(dw, v_low, m, i, j);
}
ENGINE_HD inline float osft_grad_s_element(const float* dw, const float* u_low, const float* v_low,
                                           int64_t n, int64_t m, int64_t r, int64_t j) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i)
    sum += osft_grad_s_term(dw, u_low, v_low, m, r, i, j);
  return static_cast<float>(sum);
}

// dV_low[j, c] = S_low[j] sum_i U_low[i, j] dW[i, c].
ENGINE_HD inline float osft_grad_v_element(const float* dw, const float* u_low, const float* s_low,
                                           int64_t n, int64_t m, int64_t r, int64_t j, int64_t c) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i)
    sum += static_cast<double>(u_low[i * r + j]) * dw[i * m + c];
  return static_cast<float>(static_cast<double>(s_low[j]) * sum);
}

// Left coefficients (U_high^T X)[l, j] = sum_i U_high[i, l] X[i, j] over n rows, X [n, r].
ENGINE_HD inline double osft_left_coefficient(const float* u_high, const float* x, int64_t n,
                                              int64_t k, int64_t r, int64_t l, int64_t j) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i)
    sum += static_cast<double>(u_high[i * k + l]) * x[i * r + j];
  return sum;
}

// X[i, j] - (U_high coeff)[i, j] with the summed coefficients coeff [k, r].
ENGINE_HD inline float osft_project_left_element(float x, const float* u_high, const double* coeff,
                                                 int64_t k, int64_t r, int64_t i, int64_t j) {
  double sum = 0;
  for (int64_t l = 0; l < k; ++l)
    sum += static_cast<double>(u_high[i * k + l]) * coeff[l * r + j];
  return static_cast<float>(static_cast<double>(x) - sum);
}

// Right coefficient (x V_high^T)[l] = sum_c x[c] V_high[l, c] of one row x [m].
ENGINE_HD inline double osft_right_coefficient(const float* x, const float* v_high, int64_t m,
                                               int64_t l) {
  double sum = 0;
  for (int64_t c = 0; c < m; ++c)
    sum += static_cast<double>(x[c]) * v_high[l * m + c];
  return sum;
}

// x[c] - sum_l t[l] V_high[l, c] with the row's right coefficients t [k].
ENGINE_HD inline float osft_project_right_element(float x, const double* t, const float* v_high,
                                                  int64_t k, int64_t m, int64_t c) {
  double sum = 0;
  for (int64_t l = 0; l < k; ++l)
    sum += t[l] * v_high[l * m + c];
  return static_cast<float>(static_cast<double>(x) - sum);
}

// Element i of the sum of `parts` partial vectors of `count` doubles laid out part by part,
// added in part order from 0.
ENGINE_HD inline double osft_sum_partials_element(const double* partial, int64_t parts,
                                                  int64_t count, int64_t i) {
  double sum = 0;
  for (int64_t p = 0; p < parts; ++p)
    sum += partial[p * count + i];
  return sum;
}

}  // namespace core::kmath
