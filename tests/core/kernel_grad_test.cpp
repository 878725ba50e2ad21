// Every backward kernel against central finite differences, in float64 through the same
// templated kernels the float backend runs, on odd and on round sizes. Each backward is called
// on a prefilled gradient buffer, so the tests also check that it accumulates (or, for the
// attention backward, which writes, that it overwrites).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/cpu/attention_kernels.h"
#include "core/cpu/classifier_kernels.h"
#include "core/cpu/cpu_gemm.h"
#include "core/cpu/elementwise_kernels.h"
#include "core/cpu/embedding_kernels.h"
#include "core/cpu/gemm_kernels.h"
#include "core/cpu/moe_kernels.h"
#include "core/cpu/norm_kernels.h"
#include "grad_check.h"
#include "tests/omp_threads.h"

namespace {

using core::GemmArgs;
using core::test::dot;
using core::test::expect_gradient;
using core::test::minus;
using core::test::random_vec;
using Vec = std::vector<double>;
namespace cpu = core::cpu;

struct Sizes {
  int64_t B, T, D, H, V, Vp;
  int64_t N() const { return B * T; }
  int64_t hd() const { return D / H; }
};

// One thread: the finite differences call each forward thousands of times on tiny sizes, where
// a parallel region per call only costs time (the threaded paths are checked at larger sizes in
// cpu_backend_test.cpp).
class KernelGrad : public ::testing::TestWithParam<Sizes> {
 private:
  test_util::OmpThreads one_thread_{1};
};

INSTANTIATE_TEST_SUITE_P(Sizes, KernelGrad,
                         ::testing::Values(Sizes{2, 7, 12, 3, 11, 16}, Sizes{2, 8, 32, 4, 64, 128}),
                         [](const auto& info) {
                           return info.index == 0 ? std::string("odd") : std::string("round");
                         });

// y = x W^T + b as the model's linear layers: dx = dy W, dW += dy^T x, db += colsum(dy).
TEST_P(KernelGrad, LinearGemmAndBias) {
  Sizes s = GetParam();
  int64_t N = s.N(), in = s.D, out = 3 * s.D / 2 + 1;
  Vec x = random_vec(N * in, 1), w = random_vec(out * in, 2), b = random_vec(out, 3);
  Vec wy = random_vec(N * out, 4);
  auto forward = [&] {
    Vec y(N * out);
    GemmArgs g;
    g.trans_b = true;
    g.m = N, g.n = out, g.k = in;
    cpu::gemm(g, x.data(), w.data(), y.data());
    cpu::add_bias(y.data(), b.data(), N, out);
    return dot(y, wy);
  };
  Vec dx0 = random_vec(N * in, 5), dw0 = random_vec(out * in, 6), db0 = random_vec(out, 7);
  Vec dx = dx0, dw = dw0, db = db0;
  GemmArgs gx;  // dx += dy W
  gx.m = N, gx.n = in, gx.k = out, gx.beta = 1.0f;
  cpu::gemm(gx, wy.data(), w.data(), dx.data());
  GemmArgs gw;  // dW += dy^T x
  gw.trans_a = true;
  gw.m = out, gw.n = in, gw.k = N, gw.beta = 1.0f;
  cpu::gemm(gw, wy.data(), x.data(), dw.data());
  cpu::bias_backward(db.data(), wy.data(), N, out);
  expect_gradient("gemm dx", x, forward, minus(dx, dx0));
  expect_gradient("gemm dW", w, forward, minus(dw, dw0));
  expect_gradient("bias db", b, forward, minus(db, db0));
}

TEST_P(KernelGrad, Gelu) {
  Sizes s = GetParam();
  int64_t n = s.N() * s.D;
  Vec x = random_vec(n, 11, 2.0), wy = random_vec(n, 12);
  auto forward = [&] {
    Vec y(n);
    cpu::gelu_forward(y.data(), x.data(), n);
    return dot(y, wy);
  };
  Vec d0 = random_vec(n, 13), d = d0;
  cpu::gelu_backward(d.data(), x.data(), wy.data(), n);
  expect_gradient("gelu", x, forward, minus(d, d0));
}

TEST_P(KernelGrad, GeluErf) {
  Sizes s = GetParam();
  int64_t n = s.N() * s.D;
  Vec x = random_vec(n, 14, 2.0), wy = random_vec(n, 15);
  auto forward = [&] {
    Vec y(n);
    cpu::gelu_erf_forward(y.data(), x.data(), n);
    return dot(y, wy);
  };
  Vec d0 = random_vec(n, 16), d = d0;
  cpu::gelu_erf_backward(d.data(), x.data(), wy.data(), n);
  expect_gradient("gelu_erf", x, forward, minus(d, d0));
}

TEST_P(KernelGrad, Relu2) {
  Sizes s = GetParam();
  int64_t n = s.N() * s.D;
  Vec x = random_vec(n, 21), wy = random_vec(n, 22);
  auto forward = [&] {
    Vec y(n);
    cpu::relu2_forward(y.data(), x.data(), n);
    return dot(y, wy);
  };
  Vec d0 = random_vec(n, 23), d = d0;
  cpu::relu2_backward(d.data(), x.data(), wy.data(), n);
  expect_gradient("relu2", x, forward, minus(d, d0));
}

// The recipe's learned-scalar mix out = wa a + wb b (U-net skips, x0 and value lambdas): both
// inputs and both weights, and the form without wa (out = a + wb b).
TEST_P(KernelGrad, ScalarMix) {
  Sizes s = GetParam();
  int64_t n = s.N() * s.D;
  Vec a = random_vec(n, 41), b = random_vec(n, 42), wy = random_vec(n, 43);
  Vec wa = {0.7}, wb = {-1.3};
  for (bool with_wa : {true, false}) {
    auto forward = [&] {
      Vec y(n);
      cpu::scalar_mix(y.data(), with_wa ? wa.data() : nullptr, a.data(), wb.data(), b.data(), n);
      return dot(y, wy);
    };
    Vec da0 = random_vec(n, 44), db0 = random_vec(n, 45), dwa0 = {0.25}, dwb0 = {-0.5};
    Vec da = da0, db = db0, dwa = dwa0, dwb = dwb0;
    cpu::scalar_mix_backward(da.data(), db.data(), dwa.data(), dwb.data(),
                             with_wa ? wa.data() : nullptr, a.data(), wb.data(), b.data(),
                             wy.data(), n);
    expect_gradient("scalar_mix da", a, forward, minus(da, da0));
    expect_gradient("scalar_mix db", b, forward, minus(db, db0));
    expect_gradient("scalar_mix dwb", wb, forward, minus(dwb, dwb0));
    if (with_wa) {
      expect_gradient("scalar_mix dwa", wa, forward, minus(dwa, dwa0));
    } else {
      EXPECT_EQ(dwa, dwa0) << "no wa: its gradient is left alone";
    }
  }
}

// Per-row coefficients read at a stride (a column of a [rows, K] array), written and added.
TEST_P(KernelGrad, RowScaleAdd) {
  Sizes s = GetParam();
  const int64_t rows = s.N(), cols = s.D, K = 3;
  Vec a = random_vec(rows * cols, 46), base = random_vec(rows * cols, 47),
      wy = random_vec(rows * cols, 48), c = random_vec(rows * K, 49);
  for (bool accumulate : {false, true}) {
    auto forward = [&] {
      Vec y = base;
      cpu::row_scale_add(y.data(), c.data() + 1, K, a.data(), rows, cols, accumulate);
      return dot(y, wy);
    };
    Vec da0 = random_vec(rows * cols, 50), dc0 = random_vec(rows * K, 51);
    Vec da = da0, dc = dc0;
    cpu::row_scale_add_backward(da.data(), dc.data() + 1, c.data() + 1, K, a.data(), wy.data(),
                                rows, cols);
    expect_gradient("row_scale_add da", a, forward, minus(da, da0));
    expect_gradient("row_scale_add dc", c, forward, minus(dc, dc0));
    if (accumulate) expect_gradient("row_scale_add d out", base, forward, wy);
  }
}

TEST_P(KernelGrad, Sigmoid) {
  Sizes s = GetParam();
  int64_t n = s.N() * s.D;
  Vec x = random_vec(n, 52, 2.0), wy = random_vec(n, 53);
  auto forward = [&] {
    Vec y(n);
    cpu::sigmoid_forward(y.data(), x.data(), 2.0, n);
    return dot(y, wy);
  };
  Vec d0 = random_vec(n, 54), d = d0;
  cpu::sigmoid_backward(d.data(), x.data(), wy.data(), 2.0, n);
  expect_gradient("sigmoid", x, forward, minus(d, d0));
}

// sigmoid(lambda) times a strided column (record #89's skip gate).
TEST_P(KernelGrad, SigmoidScale) {
  Sizes s = GetParam();
  const int64_t n = s.N(), K = 4;
  Vec lambda = {-1.5}, c = random_vec(n * K, 55), wy = random_vec(n, 56);
  auto forward = [&] {
    Vec y(n);
    cpu::sigmoid_scale(y.data(), lambda.data(), c.data() + 3, K, n);
    return dot(y, wy);
  };
  Vec dc0 = random_vec(n * K, 57), dl0 = {0.25}, dc = dc0, dl = dl0;
  cpu::sigmoid_scale_backward(dc.data() + 3, dl.data(), lambda.data(), c.data() + 3, K, wy.data(),
                              n);
  expect_gradient("sigmoid_scale dc", c, forward, minus(dc, dc0));
  expect_gradient("sigmoid_scale dlambda", lambda, forward, minus(dl, dl0));
}

TEST_P(KernelGrad, LayerNorm) {
  Sizes s = GetParam();
  int64_t N = s.N(), C = s.D;
  Vec x = random_vec(N * C, 31, 1.5), w = random_vec(C, 32), b = random_vec(C, 33);
  for (int64_t i = 0; i < N * C; ++i)
    x[i] += 0.3 * (i % 5);  // nonzero row means
  Vec wy = random_vec(N * C, 34);
  Vec mean(N), rstd(N);
  auto forward = [&] {
    Vec y(N * C);
    cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                           1e-5);
    return dot(y, wy);
  };
  forward();
  Vec dx0 = random_vec(N * C, 35), dw0 = random_vec(C, 36), db0 = random_vec(C, 37);
  Vec dx = dx0, dw = dw0, db = db0;
  cpu::layernorm_backward(dx.data(), dw.data(), db.data(), wy.data(), x.data(), w.data(),
                          mean.data(), rstd.data(), N, C);
  expect_gradient("layernorm dx", x, forward, minus(dx, dx0));
  expect_gradient("layernorm dw", w, forward, minus(dw, dw0));
  expect_gradient("layernorm db", b, forward, minus(db, db0));
}

TEST_P(KernelGrad, RmsNorm) {
  Sizes s = GetParam();
  int64_t N = s.N(), C = s.D;
  Vec x = random_vec(N * C, 41), wy = random_vec(N * C, 42), rstd(N);
  auto forward = [&] {
    Vec y(N * C);
    cpu::rmsnorm_forward(y.data(), rstd.data(), x.data(), N, C, 1e-6);
    return dot(y, wy);
  };
  forward();
  Vec d0 = random_vec(N * C, 43), d = d0;
  cpu::rmsnorm_backward(d.data(), wy.data(), x.data(), rstd.data(), N, C);
  expect_gradient("rmsnorm", x, forward, minus(d, d0));
}

TEST_P(KernelGrad, Softmax) {
  Sizes s = GetParam();
  int64_t N = s.N(), C = s.V;
  Vec x = random_vec(N * C, 51, 2.0), wy = random_vec(N * C, 52), y(N * C);
  auto forward = [&] {
    cpu::softmax_forward(y.data(), x.data(), N, C);
    return dot(y, wy);
  };
  forward();
  Vec d0 = random_vec(N * C, 53), d = d0;
  cpu::softmax_backward(d.data(), wy.data(), y.data(), N, C);
  expect_gradient("softmax", x, forward, minus(d, d0));
}

TEST_P(KernelGrad, EmbeddingWithPositions) {
  Sizes s = GetParam();
  int64_t B = s.B, T = s.T, D = s.D, V = s.V;
  std::vector<int32_t> tokens(B * T);
  for (int64_t i = 0; i < B * T; ++i)
    tokens[i] = static_cast<int32_t>((i * 7) % (V - 2));
  tokens[1] = tokens[0];  // a repeated token sums its gradients
  Vec wte = random_vec(V * D, 61), wpe = random_vec(T * D, 62), wy = random_vec(B * T * D, 63);
  auto forward = [&] {
    Vec y(B * T * D);
    cpu::embedding_forward(y.data(), tokens.data(), wte.data(), wpe.data(), B, T, D);
    return dot(y, wy);
  };
  Vec dte0 = random_vec(V * D, 64), dpe0 = random_vec(T * D, 65), dte = dte0, dpe = dpe0;
  cpu::embedding_backward(dte.data(), dpe.data(), wy.data(), tokens.data(), B, T, D);
  expect_gradient("embedding dwte", wte, forward, minus(dte, dte0));
  expect_gradient("embedding dwpe", wpe, forward, minus(dpe, dpe0));
  // Rows no token indexes (the padded vocabulary) get exactly nothing.
  for (int64_t d = 0; d < D; ++d)
    EXPECT_EQ(dte[(V - 1) * D + d], dte0[(V - 1) * D + d]);
}

// Record #34's smear over rows of T: dx (written) and the accumulated dw and dlambda.
TEST_P(KernelGrad, Smear) {
  Sizes s = GetParam();
  const int64_t B = s.B, T = s.T, D = s.D, K = 12, n = B * T * D;
  Vec x = random_vec(n, 171), w = random_vec(K, 172), lambda = {0.8}, wy = random_vec(n, 173);
  Vec gate(B * T);
  auto forward = [&] {
    Vec y(n);
    cpu::smear_forward(y.data(), gate.data(), x.data(), w.data(), lambda.data(), B, T, D, K);
    return dot(y, wy);
  };
  forward();
  Vec dx = random_vec(n, 174), dw0 = random_vec(K, 175), dl0 = {0.3}, dw = dw0, dl = dl0;
  cpu::smear_backward(dx.data(), dw.data(), dl.data(), x.data(), w.data(), lambda.data(),
                      gate.data(), wy.data(), B, T, D, K);
  expect_gradient("smear dx", x, forward, dx);
  expect_gradient("smear dw", w, forward, minus(dw, dw0));
  expect_gradient("smear dlambda", lambda, forward, minus(dl, dl0));
}

// Record #89's sign trick (its own backward) and gated injection with one coefficient for all
// rows and one per row: dx is dout, dsrc and dc accumulate.
TEST_P(KernelGrad, BigramSignsAndCoefAdd) {
  Sizes s = GetParam();
  const int64_t B = s.B, T = s.T, D = s.D, N = B * T, n = N * D, sign_rows = 5;
  std::vector<int32_t> tokens(N);
  for (int64_t i = 0; i < N; ++i)
    tokens[i] = static_cast<int32_t>((i * 7) % s.V);
  Vec signs(sign_rows * D);
  for (int64_t i = 0; i < sign_rows * D; ++i)
    signs[i] = (i * 5) % 3 == 0 ? -1.0 : 1.0;
  Vec src = random_vec(n, 181), x = random_vec(n, 182), wy = random_vec(n, 183);
  Vec coefs = random_vec(2 * N, 184);
  for (int64_t stride : {int64_t{0}, int64_t{2}}) {
    auto forward = [&] {
      Vec bg = src, y(n);
      cpu::bigram_signs(bg.data(), tokens.data(), signs.data(), B, T, D, sign_rows);
      cpu::coef_add(y.data(), x.data(), coefs.data(), stride, bg.data(), N, D);
      return dot(y, wy);
    };
    Vec bg = src;
    cpu::bigram_signs(bg.data(), tokens.data(), signs.data(), B, T, D, sign_rows);
    Vec dbg0 = random_vec(n, 185), dc0 = random_vec(2 * N, 186), dbg = dbg0, dc = dc0;
    cpu::coef_add_backward(dbg.data(), dc.data(), coefs.data(), stride, bg.data(), wy.data(), N, D);
    Vec dsrc = minus(dbg, dbg0);
    cpu::bigram_signs(dsrc.data(), tokens.data(), signs.data(), B, T, D, sign_rows);
    const std::string at = " (stride " + std::to_string(stride) + ")";
    expect_gradient("coef_add dx" + at, x, forward, wy);
    expect_gradient("bigram signs and coef_add dsrc" + at, src, forward, dsrc);
    expect_gradient("coef_add dc" + at, coefs, forward, minus(dc, dc0));
  }
}

TEST_P(KernelGrad, SplitAndMergeHeads) {
  Sizes s = GetParam();
  int64_t B = s.B, T = s.T, H = s.H, hd = s.hd(), n = B * T * H * hd;
  Vec qkv = random_vec(3 * n, 71), wq = random_vec(n, 72), wk = random_vec(n, 73),
      wv = random_vec(n, 74);
  auto split = [&] {
    Vec q(n), k(n), v(n);
    cpu::split_heads(q.data(), k.data(), v.data(), qkv.data(), B, T, H, hd);
    return dot(q, wq) + dot(k, wk) + dot(v, wv);
  };
  Vec d0 = random_vec(3 * n, 75), d = d0;
  cpu::split_heads_backward(d.data(), wq.data(), wk.data(), wv.data(), B, T, H, hd);
  expect_gradient("split_heads", qkv, split, minus(d, d0));

  Vec a = random_vec(n, 76), wo = random_vec(n, 77);
  auto merge = [&] {
    Vec out(n);
    cpu::merge_heads(out.data(), a.data(), B, T, H, hd);
    return dot(out, wo);
  };
  Vec da0 = random_vec(n, 78), da = da0;
  cpu::merge_heads_backward(da.data(), wo.data(), B, T, H, hd);
  expect_gradient("merge_heads", a, merge, minus(da, da0));

  // Layout: q[b, h, t, :] is qkv[b, t, 0, h, :]; merge puts head h at columns h*hd of a row.
  Vec q(n), k(n), v(n), out(n);
  cpu::split_heads(q.data(), k.data(), v.data(), qkv.data(), B, T, H, hd);
  int64_t b = B - 1, h = H - 1, t = T - 2, j = hd - 1, D = H * hd;
  EXPECT_EQ(q[((b * H + h) * T + t) * hd + j], qkv[(b * T + t) * 3 * D + 0 * D + h * hd + j]);
  EXPECT_EQ(v[((b * H + h) * T + t) * hd + j], qkv[(b * T + t) * 3 * D + 2 * D + h * hd + j]);
  cpu::merge_heads(out.data(), k.data(), B, T, H, hd);
  EXPECT_EQ(out[(b * T + t) * D + h * hd + j], qkv[(b * T + t) * 3 * D + 1 * D + h * hd + j]);
}

TEST_P(KernelGrad, Rotary) {
  Sizes s = GetParam();
  int64_t BH = s.B * s.H, T = s.T, hd = s.hd(), n = BH * T * hd;
  Vec x = random_vec(n, 81), wy = random_vec(n, 82);
  auto forward = [&] {
    Vec y(n);
    cpu::rotary_forward(y.data(), x.data(), BH, T, hd, 10000.0);
    return dot(y, wy);
  };
  Vec d0 = random_vec(n, 83), d = d0;
  cpu::rotary_backward(d.data(), wy.data(), BH, T, hd, 10000.0);
  expect_gradient("rotary", x, forward, minus(d, d0));

  // The spec's formula at one element, and in-place application.
  Vec y(n), inplace = x;
  cpu::rotary_forward(y.data(), x.data(), BH, T, hd, 10000.0);
  cpu::rotary_forward(inplace.data(), inplace.data(), BH, T, hd, 10000.0);
  EXPECT_EQ(y, inplace);
  int64_t half = hd / 2, row = BH * T - 1, t = row % T, j = half - 1;
  double angle = t * std::pow(10000.0, -static_cast<double>(j) / half);
  double x0 = x[row * hd + j], x1 = x[row * hd + j + half];
  EXPECT_NEAR(y[row * hd + j], x0 * std::cos(angle) + x1 * std::sin(angle), 1e-12);
  EXPECT_NEAR(y[row * hd + j + half], -x0 * std::sin(angle) + x1 * std::cos(angle), 1e-12);
}

// Every row of softmax(scale q k^T + causal mask), from the saved log-sum-exp: sums to one.
void expect_lse_normalises(const Vec& q, const Vec& k, const Vec& lse, int64_t BH, int64_t T,
                           int64_t hd, double scale) {
  for (int64_t h = 0; h < BH; ++h) {
    for (int64_t t = 0; t < T; ++t) {
      double sum = 0.0;
      for (int64_t j = 0; j <= t; ++j) {
        double s = 0.0;
        for (int64_t d = 0; d < hd; ++d)
          s += q[(h * T + t) * hd + d] * k[(h * T + j) * hd + d];
        sum += std::exp(scale * s - lse[h * T + t]);
      }
      ASSERT_NEAR(sum, 1.0, 1e-12) << "head " << h << " row " << t;
    }
  }
}

// The model's attention layout: q, k, v read in place from qkv [B, T, 3, H, hd], out [B, T, H hd].
core::AttentionLayout qkv_layout(int64_t H, int64_t T, int64_t hd) {
  using L = core::AttentionLayout;
  const int64_t D = H * hd;
  const core::HeadStrides in = L::token_rows(T, hd, 3 * D);
  return {H, in, in, in, L::token_rows(T, hd, D)};
}

// The backward recomputes the probabilities from the forward's out and lse; both head
// schedules, writing over gradients prefilled with noise (=: every element has one producer).
// Packed heads, then the model's layout: q, k, v strided in qkv (one gradient check covers all
// three, each element of qkv being one of them) and the heads' outputs merged as written.
TEST_P(KernelGrad, CausalAttention) {
  Sizes s = GetParam();
  int64_t BH = s.B * s.H, T = s.T, hd = s.hd(), n = BH * T * hd, D = s.D;
  double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  Vec q = random_vec(n, 91), k = random_vec(n, 92), v = random_vec(n, 93), wy = random_vec(n, 94);
  Vec out(n), lse(BH * T);
  for (auto mode : {cpu::HeadParallel::kHeads, cpu::HeadParallel::kGemm}) {
    auto forward = [&] {
      cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), BH, T, hd, scale,
                             mode);
      return dot(out, wy);
    };
    forward();
    Vec dq = random_vec(n, 95), dk = random_vec(n, 96), dv = random_vec(n, 97);
    cpu::attention_backward(dq.data(), dk.data(), dv.data(), wy.data(), out.data(), lse.data(),
                            q.data(), k.data(), v.data(), BH, T, hd, scale, mode);
    expect_gradient("attention dq", q, forward, dq);
    expect_gradient("attention dk", k, forward, dk);
    expect_gradient("attention dv", v, forward, dv);
  }
  expect_lse_normalises(q, k, lse, BH, T, hd, scale);

  const core::AttentionLayout L = qkv_layout(s.H, T, hd);
  Vec qkv = random_vec(3 * n, 98);
  const double* x = qkv.data();
  for (auto mode : {cpu::HeadParallel::kHeads, cpu::HeadParallel::kGemm}) {
    auto forward = [&] {
      cpu::attention_forward(out.data(), lse.data(), x, x + D, x + 2 * D, BH, T, hd, scale, mode,
                             {}, L);
      return dot(out, wy);
    };
    forward();
    Vec dqkv = random_vec(3 * n, 99);
    double* d = dqkv.data();
    cpu::attention_backward(d, d + D, d + 2 * D, wy.data(), out.data(), lse.data(), x, x + D,
                            x + 2 * D, BH, T, hd, scale, mode, {}, L);
    expect_gradient("attention d qkv (strided)", qkv, forward, dqkv);
  }
}

// Longer than one query block of the kernel (kAttnBlock rows), so the blocked GEMMs over keys
// [0, r1) and the sums of dK, dV across blocks are covered too (written over noise).
TEST(KernelGradBlocks, CausalAttentionAcrossQueryBlocks) {
  test_util::OmpThreads one_thread(1);
  const int64_t BH = 2, T = cpu::kAttnBlock + 6, hd = 4, n = BH * T * hd;
  Vec q = random_vec(n, 121), k = random_vec(n, 122), v = random_vec(n, 123),
      wy = random_vec(n, 124), out(n), lse(BH * T);
  auto forward = [&] {
    cpu::attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), BH, T, hd, 0.5);
    return dot(out, wy);
  };
  forward();
  Vec dq = random_vec(n, 125), dk = random_vec(n, 126), dv = random_vec(n, 127);
  cpu::attention_backward(dq.data(), dk.data(), dv.data(), wy.data(), out.data(), lse.data(),
                          q.data(), k.data(), v.data(), BH, T, hd, 0.5);
  expect_gradient("attention dq", q, forward, dq);
  expect_gradient("attention dk", k, forward, dk);
  expect_gradient("attention dv", v, forward, dv);
  expect_lse_normalises(q, k, lse, BH, T, hd, 0.5);
}

// Document masking and a sliding window (core::AttentionMask): against a plain masked attention
// written out from the definition, and the backward against central differences, in float64.
// T spans three query blocks and the window (37) divides neither T nor the block; row 0 has a
// one-token document (position 5), a document longer than the window (from 90 on) and one that
// starts in the middle of a query block; row 1 has a single document (the window alone).
TEST(KernelGradBlocks, DocumentAndWindowMaskedAttention) {
  test_util::OmpThreads one_thread(1);
  // The model's layout (q, k, v strided in qkv, out [B, T, H hd]) with two heads a batch row.
  const int64_t B = 2, H = 2, BH = B * H, T = 2 * cpu::kAttnBlock + 13, hd = 4, D = H * hd;
  const int64_t n = BH * T * hd, window = 37;
  const std::vector<int64_t> doc_starts = {0, 5, 6, 90};
  std::vector<int32_t> begin(B * T);
  for (int64_t t = 0; t < T; ++t) {
    int64_t doc = 0;
    for (int64_t d : doc_starts)
      if (d <= t) doc = d;
    begin[t] = static_cast<int32_t>(std::max(doc, t - window + 1));
    begin[T + t] = static_cast<int32_t>(std::max<int64_t>(0, t - window + 1));
  }
  const core::AttentionMask mask{begin.data(), H};
  const core::AttentionLayout L = qkv_layout(H, T, hd);
  const double scale = 0.3;
  Vec qkv = random_vec(3 * n, 131), wy = random_vec(n, 134), out(n), lse(BH * T);
  const double* x = qkv.data();
  auto forward = [&] {
    cpu::attention_forward(out.data(), lse.data(), x, x + D, x + 2 * D, BH, T, hd, scale,
                           cpu::HeadParallel::kAuto, mask, L);
    return dot(out, wy);
  };
  forward();
  // The definition: softmax over keys [begin_t, t] of scale q_t . k_j, head h of token (b, t)
  // at columns h hd of its q, k, v parts.
  auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h, int64_t d) {
    return qkv[(b * T + t) * 3 * D + part * D + h * hd + d];
  };
  double worst = 0.0;
  for (int64_t bh = 0; bh < BH; ++bh) {
    const int64_t b = bh / H, h = bh % H;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t lo = begin[b * T + t];
      std::vector<double> sc;
      double mx = -1e300;
      for (int64_t j = lo; j <= t; ++j) {
        double dotqk = 0.0;
        for (int64_t d = 0; d < hd; ++d)
          dotqk += at(b, t, 0, h, d) * at(b, j, 1, h, d);
        sc.push_back(scale * dotqk);
        mx = std::max(mx, sc.back());
      }
      double z = 0.0;
      for (double y : sc)
        z += std::exp(y - mx);
      worst = std::max(worst, std::abs(lse[bh * T + t] - (mx + std::log(z))));
      for (int64_t d = 0; d < hd; ++d) {
        double o = 0.0;
        for (int64_t j = lo; j <= t; ++j)
          o += std::exp(sc[j - lo] - mx) / z * at(b, j, 2, h, d);
        worst = std::max(worst, std::abs(out[(b * T + t) * D + h * hd + d] - o));
      }
    }
  }
  core::test::expect_within("masked attention vs the definition, max abs", worst, 1e-12);
  EXPECT_EQ(begin[5], 5);
  EXPECT_EQ(begin[6], 6);             // the one-token document [5, 6) sees itself only
  Vec dqkv = random_vec(3 * n, 135);  // noise: every element is written
  double* d = dqkv.data();
  cpu::attention_backward(d, d + D, d + 2 * D, wy.data(), out.data(), lse.data(), x, x + D,
                          x + 2 * D, BH, T, hd, scale, cpu::HeadParallel::kAuto, mask, L);
  expect_gradient("masked attention d qkv", qkv, forward, dqkv);
}

// bf16 precision's attention (out and d q, k, v stored as bf16, delta from the bf16 out) against
// central differences of the float64 attention: the model's layout with d q, k, v straight into
// a bf16 d qkv (filled with NaNs: every element is written), documents and the record's block
// windows (begins on 16-token blocks), T across query blocks. The bf16 values are the f32 ones
// rounded (Bf16Store.Attention* checks the bits), so the bar is bf16's: measured 2.0e-3.
TEST(KernelGradBlocks, Bf16AttentionWithinBf16OfFiniteDifferences) {
  test_util::OmpThreads one_thread(1);
  const int64_t B = 2, H = 2, BH = B * H, T = cpu::kAttnBlock + 13, hd = 8, D = H * hd;
  const int64_t n = BH * T * hd;
  std::vector<int32_t> begin(B * T);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t block_window = std::max<int64_t>(0, (t / 16 - 2) * 16);  // three blocks
    begin[t] = static_cast<int32_t>(std::max<int64_t>(t >= 40 ? 40 : 0, block_window));
    begin[T + t] = static_cast<int32_t>(block_window);
  }
  const core::AttentionMask mask{begin.data(), H};
  const core::AttentionLayout L = qkv_layout(H, T, hd);
  const double scale = 0.35;
  Vec qkv = random_vec(3 * n, 141), wy = random_vec(n, 142), out(n), lse(BH * T);
  const double* x = qkv.data();
  auto forward = [&] {
    cpu::attention_forward(out.data(), lse.data(), x, x + D, x + 2 * D, BH, T, hd, scale,
                           cpu::HeadParallel::kAuto, mask, L);
    return dot(out, wy);
  };
  const std::vector<float> qkv_f = core::test::to_float(qkv), wy_f = core::test::to_float(wy);
  const float* xf = qkv_f.data();
  std::vector<core::bf16> out_b(n), dqkv_b(3 * n, core::bf16{0x7FC1});
  std::vector<float> lse_f(BH * T);
  cpu::attention_forward(out_b.data(), lse_f.data(), xf, xf + D, xf + 2 * D, BH, T, hd,
                         float(scale), cpu::HeadParallel::kAuto, mask, L);
  core::bf16* d = dqkv_b.data();
  cpu::attention_backward(d, d + D, d + 2 * D, wy_f.data(), out_b.data(), lse_f.data(), xf, xf + D,
                          xf + 2 * D, BH, T, hd, float(scale), cpu::HeadParallel::kAuto, mask, L);
  Vec dqkv(3 * n);
  for (int64_t i = 0; i < 3 * n; ++i)
    dqkv[i] = core::kmath::float_from_bf16(dqkv_b[i]);
  expect_gradient("bf16 attention d qkv (block windows)", qkv, forward, dqkv, 5e-3);
}

// Cross-entropy over the first V of Vp columns, with and without the soft-cap.
TEST_P(KernelGrad, CrossEntropyPaddedAndSoftcapped) {
  Sizes s = GetParam();
  int64_t N = s.N(), V = s.V, Vp = s.Vp;
  std::vector<int32_t> targets(N);
  for (int64_t i = 0; i < N; ++i)
    targets[i] = static_cast<int32_t>((i * 5 + 3) % V);
  for (double cap : {0.0, 3.0}) {
    Vec logits = random_vec(N * Vp, 101, 2.5);
    // Huge padded logits must not matter: they are outside the softmax.
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t j = V; j < Vp; ++j)
        logits[n * Vp + j] = 1e3;
    }
    double scale = 1.0 / N;
    Vec losses(N);
    auto forward = [&] {
      cpu::cross_entropy(losses.data(), static_cast<double*>(nullptr), logits.data(),
                         targets.data(), N, V, Vp, cap, scale);
      double l = 0.0;
      for (double x : losses)
        l += x * scale;
      return l;
    };
    forward();
    // Loss of row 0 directly from the definition.
    double mx = -1e300, sum = 0.0;
    auto z = [&](int64_t j) { return cap > 0 ? cap * std::tanh(logits[j] / cap) : logits[j]; };
    for (int64_t j = 0; j < V; ++j)
      mx = std::max(mx, z(j));
    for (int64_t j = 0; j < V; ++j)
      sum += std::exp(z(j) - mx);
    EXPECT_NEAR(losses[0], mx + std::log(sum) - z(targets[0]), 1e-12);

    Vec d(N * Vp, 7.0);  // overwritten, not accumulated
    cpu::cross_entropy(losses.data(), d.data(), logits.data(), targets.data(), N, V, Vp, cap,
                       scale);
    expect_gradient(cap > 0 ? "cross_entropy softcap" : "cross_entropy", logits, forward, d);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t j = V; j < Vp; ++j)
        ASSERT_EQ(d[n * Vp + j], 0.0) << "padded column " << j;
    }
    // dlogits may alias logits.
    Vec alias = logits;
    cpu::cross_entropy(losses.data(), alias.data(), alias.data(), targets.data(), N, V, Vp, cap,
                       scale);
    EXPECT_EQ(alias, d);
  }
}

// Record #89's training loss (kmath::LossTerms): per position t of a row of T, the weighted
// cross-entropies of the targets t+1, t+2, t+3 (while inside the row) and of the next token's
// prefix token. The losses equal the plain kernel's per target, summed with the weights; the
// gradient is checked against central differences, with targets that repeat (two terms on one
// column) and on the rows' last positions, where fewer offsets have a term: there the gradient is
// the loss's own (its columns sum to 0 without a cap), not record #89's, which normalises over
// every weight.
TEST_P(KernelGrad, CrossEntropyMultiTokenAndPrefixTerms) {
  Sizes s = GetParam();
  const int64_t N = s.N(), V = s.V, Vp = s.Vp, T = s.T;
  std::vector<int32_t> targets(N), prefix_of(V);
  for (int64_t i = 0; i < N; ++i)
    targets[i] = static_cast<int32_t>((i / 2 * 5 + 3) % V);  // pairs: offsets 0 and 1 collide
  for (int64_t v = 0; v < V; ++v)
    prefix_of[v] = v % 3 == 0 ? -1 : static_cast<int32_t>(v % 2 == 0 ? v : (v * 7) % V);
  core::kmath::LossTerms terms;
  terms.offsets = 3;
  terms.weight[0] = 1.0f, terms.weight[1] = 0.5f, terms.weight[2] = 0.25f;
  terms.row_tokens = T;
  terms.prefix_of = prefix_of.data();
  terms.prefix_weight = 0.25f;
  for (double cap : {0.0, 3.0}) {
    Vec logits = random_vec(N * Vp, 107, 2.5);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t j = V; j < Vp; ++j)
        logits[n * Vp + j] = 1e3;  // outside the softmax
    }
    const double scale = 1.0 / N;
    Vec losses(N);
    auto forward = [&] {
      cpu::cross_entropy(losses.data(), static_cast<double*>(nullptr), logits.data(),
                         targets.data(), N, V, Vp, cap, scale, terms);
      double l = 0.0;
      for (double x : losses)
        l += x * scale;
      return l;
    };
    forward();
    // Each term is a plain cross-entropy of its target.
    Vec want(N, 0.0), plain(N);
    for (int i = 0; i < 4; ++i) {
      std::vector<int32_t> shifted(N);
      for (int64_t n = 0; n < N; ++n) {
        const int64_t m = std::min(n + i, N - 1);
        shifted[n] = i < 3 ? targets[m] : std::max(prefix_of[targets[n]], 0);
      }
      cpu::cross_entropy(plain.data(), static_cast<double*>(nullptr), logits.data(), shifted.data(),
                         N, V, Vp, cap, scale);
      for (int64_t n = 0; n < N; ++n) {
        const bool present = i < 3 ? n % T + i < T : prefix_of[targets[n]] >= 0;
        if (present) want[n] += (i < 3 ? terms.weight[i] : terms.prefix_weight) * plain[n];
      }
    }
    for (int64_t n = 0; n < N; ++n)
      EXPECT_NEAR(losses[n], want[n], 1e-12 * want[n]) << "row " << n << " cap " << cap;

    Vec d(N * Vp, 7.0);  // overwritten, not accumulated
    cpu::cross_entropy(losses.data(), d.data(), logits.data(), targets.data(), N, V, Vp, cap, scale,
                       terms);
    expect_gradient(cap > 0 ? "multi-target softcap" : "multi-target", logits, forward, d);
    for (int64_t n = 0; n < N; ++n) {
      double sum = 0.0;
      for (int64_t j = 0; j < Vp; ++j)
        sum += d[n * Vp + j];
      if (cap == 0.0) {
        EXPECT_NEAR(sum, 0.0, 1e-15) << "row " << n;
      }
      for (int64_t j = V; j < Vp; ++j)
        ASSERT_EQ(d[n * Vp + j], 0.0) << "padded column " << j;
    }
    Vec alias = logits;  // dlogits may alias logits
    cpu::cross_entropy(losses.data(), alias.data(), alias.data(), targets.data(), N, V, Vp, cap,
                       scale, terms);
    EXPECT_EQ(alias, d);
  }
}

// A prefix outside the vocabulary is refused, naming the target and the row.
TEST(CrossEntropyTerms, RejectsAPrefixOutsideTheVocabulary) {
  const std::vector<int32_t> targets = {1, 2}, prefix_of = {-1, -1, 9};
  std::vector<double> logits(2 * 4, 0.5), losses(2);
  core::kmath::LossTerms terms;
  terms.row_tokens = 2;
  terms.prefix_of = prefix_of.data();
  terms.prefix_weight = 0.25f;
  try {
    cpu::cross_entropy(losses.data(), static_cast<double*>(nullptr), logits.data(), targets.data(),
                       2, 3, 4, 0.0, 1.0, terms);
    FAIL() << "an out-of-range prefix was accepted";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("prefix 9 of target 2 at row 1"), std::string::npos)
        << e.what();
  }
}

// The cross-entropy on bf16 logits (bf16 precision's head) at logits that are bf16 values: the
// float64 kernel's gradient there is checked against central differences in float64, and the
// bf16 kernel's d logits (f32 math, each rounded once) must be that gradient within half a bf16
// unit (u = 2^-8 relative at most), plus the f32 math's error (its exp and tanh within a few float
// ulps of a softmax: 1e-6 of the row's largest gradient, dloss_scale); the losses within 1e-6
// relative.
TEST_P(KernelGrad, CrossEntropyOnBf16Logits) {
  Sizes s = GetParam();
  int64_t N = s.N(), V = s.V, Vp = s.Vp;
  std::vector<int32_t> targets(N);
  for (int64_t i = 0; i < N; ++i)
    targets[i] = static_cast<int32_t>((i * 5 + 3) % V);
  for (double cap : {0.0, 3.0}) {
    const Vec drawn = random_vec(N * Vp, 103, 2.5);
    std::vector<core::bf16> z(drawn.size());
    Vec logits(drawn.size());
    for (size_t i = 0; i < drawn.size(); ++i) {
      z[i] = core::kmath::bf16_from_float(static_cast<float>(drawn[i]));
      logits[i] = core::kmath::float_from_bf16(z[i]);
    }
    const double scale = 1.0 / N;
    Vec losses(N), d(N * Vp);
    auto forward = [&] {
      cpu::cross_entropy(losses.data(), static_cast<double*>(nullptr), logits.data(),
                         targets.data(), N, V, Vp, cap, scale);
      double l = 0.0;
      for (double x : losses)
        l += x * scale;
      return l;
    };
    cpu::cross_entropy(losses.data(), d.data(), logits.data(), targets.data(), N, V, Vp, cap,
                       scale);
    const Vec want_losses = losses;
    expect_gradient(cap > 0 ? "bf16 logits softcap" : "bf16 logits", logits, forward, d);

    std::vector<float> got_losses(N);
    std::vector<core::bf16> dz = z;  // in place, as the model runs it
    cpu::cross_entropy(got_losses.data(), dz.data(), dz.data(), targets.data(), N, V, Vp,
                       static_cast<float>(cap), static_cast<float>(scale));
    for (int64_t n = 0; n < N; ++n)
      EXPECT_NEAR(got_losses[n], want_losses[n], 1e-6 * std::fabs(want_losses[n])) << "row " << n;
    for (int64_t i = 0; i < N * Vp; ++i) {
      const double got = core::kmath::float_from_bf16(dz[i]);
      ASSERT_LE(std::fabs(got - d[i]), 0x1p-8 * std::fabs(d[i]) + 1e-6 * scale)
          << "cap " << cap << " at " << i;
      if (i % Vp >= V) {
        ASSERT_EQ(dz[i].bits, 0) << "padded column " << i % Vp;
      }
    }
  }
}

// out = gather(src, index, w): dsrc = scatter_add(dout, index, w), dw = row_dot(dout, src[index]);
// and dst += scatter_add(src, index, w): dsrc = gather(ddst, index, w), dw = row_dot(...).
TEST_P(KernelGrad, GatherScatterRowDot) {
  Sizes s = GetParam();
  int64_t rows = s.V, n = s.N(), D = s.D;
  std::vector<int32_t> index(n);
  for (int64_t i = 0; i < n; ++i)
    index[i] = static_cast<int32_t>((i * 3) % rows);
  Vec src = random_vec(rows * D, 111), w = random_vec(n, 112), wy = random_vec(n * D, 113);
  auto gather = [&] {
    Vec out(n * D);
    cpu::gather_rows(out.data(), src.data(), index.data(), w.data(), n, D);
    return dot(out, wy);
  };
  Vec ds0 = random_vec(rows * D, 114), ds = ds0;
  cpu::scatter_add_rows(ds.data(), wy.data(), index.data(), w.data(), n, D);
  Vec picked(n * D), dw(n);
  cpu::gather_rows(picked.data(), src.data(), index.data(), static_cast<const double*>(nullptr), n,
                   D);
  cpu::row_dot(dw.data(), wy.data(), picked.data(), n, D);
  expect_gradient("gather_rows dsrc", src, gather, minus(ds, ds0));
  expect_gradient("gather_rows dweight", w, gather, dw);

  Vec x = random_vec(n * D, 115), wd = random_vec(rows * D, 116);
  auto scatter = [&] {
    Vec dst(rows * D, 0.5);
    cpu::scatter_add_rows(dst.data(), x.data(), index.data(), w.data(), n, D);
    return dot(dst, wd);
  };
  Vec dx(n * D), gathered(n * D), dw2(n);
  cpu::gather_rows(dx.data(), wd.data(), index.data(), w.data(), n, D);
  cpu::gather_rows(gathered.data(), wd.data(), index.data(), static_cast<const double*>(nullptr), n,
                   D);
  cpu::row_dot(dw2.data(), gathered.data(), x.data(), n, D);
  expect_gradient("scatter_add_rows dsrc", x, scatter, dx);
  expect_gradient("scatter_add_rows dweight", w, scatter, dw2);
}

}  // namespace
