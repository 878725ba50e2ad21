// GemmOps::gemm_epilogue on the CPU: every epilogue kind, f32 and bf16 inputs, f32 and bf16 D,
// odd shapes and all transposes, against the unfused sequence of ops the model ran before the
// epilogues (bit for bit), the f32 kinds also against a float64 evaluation of their definition,
// and the arguments each kind refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/check.h"
#include "core/kernel_math.h"
#include "tests/backend_test_data.h"

namespace core {
namespace {

using test_data::random_vector;

struct Shape {
  bool trans_a, trans_b;
  int64_t m, n, k;
};

const Shape kShapes[] = {{false, true, 37, 53, 29},  {false, false, 16, 24, 8},
                         {true, true, 5, 11, 64},    {true, false, 1, 7, 3},
                         {false, true, 130, 96, 48}, {true, true, 64, 40, 33},
                         {false, true, 300, 160, 24}};  // past kParallelMin: row blocks in parallel

GemmArgs args_of(const Shape& s) {
  GemmArgs g;
  g.trans_a = s.trans_a, g.trans_b = s.trans_b;
  g.m = s.m, g.n = s.n, g.k = s.k;
  return g;
}

std::vector<bf16> to_bf16(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  cpu_backend().f32_to_bf16(out.data(), v.data(), static_cast<int64_t>(v.size()));
  return out;
}

std::vector<uint16_t> bits(const std::vector<bf16>& v) {
  std::vector<uint16_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * sizeof(uint16_t));
  return out;
}

// Inputs of one case, scaled so X spreads over GELU's curved part (|X| up to a few units).
struct Case {
  GemmArgs g;
  std::vector<float> a, b, c, bias, dbias0, pre;
  Case(const Shape& s, uint64_t seed)
      : g(args_of(s)),
        a(random_vector(s.m * s.k, seed, 0.3f)),
        b(random_vector(s.k * s.n, seed + 1, 0.3f)),
        c(random_vector(s.m * s.n, seed + 2)),
        bias(random_vector(s.n, seed + 3)),
        dbias0(random_vector(s.m, seed + 4)),
        pre(random_vector(s.m * s.n, seed + 5, 2.0f)) {}
};

const GemmEpilogue kF32Kinds[] = {GemmEpilogue::none, GemmEpilogue::bias, GemmEpilogue::bias_gelu,
                                  GemmEpilogue::dgelu, GemmEpilogue::bgrad};

// The unfused sequence for an f32 D: what the model called before the epilogues.
template <typename In>
void unfused_f32(Backend& be, GemmArgs g, GemmEpilogue kind, const Case& t, const In* a,
                 const In* b, const float* c, std::vector<float>& d, std::vector<float>& aux,
                 std::vector<float>& dbias) {
  const int64_t mn = g.m * g.n;
  switch (kind) {
    case GemmEpilogue::none:
    case GemmEpilogue::bias:
    case GemmEpilogue::bgrad:
      if (c) std::memcpy(d.data(), c, static_cast<size_t>(mn) * sizeof(float));
      if (kind == GemmEpilogue::bgrad) be.bias_backward(dbias.data(), a, g.k, g.m);
      be.gemm(g, a, b, d.data());
      if (kind == GemmEpilogue::bias) be.add_bias(d.data(), t.bias.data(), g.m, g.n);
      return;
    case GemmEpilogue::bias_gelu:
      be.gemm(g, a, b, aux.data());
      be.add_bias(aux.data(), t.bias.data(), g.m, g.n);
      be.gelu_forward(d.data(), aux.data(), mn);
      return;
    case GemmEpilogue::dgelu: {
      std::vector<float> x(static_cast<size_t>(mn));
      be.gemm(g, a, b, x.data());
      std::fill(d.begin(), d.end(), 0.0f);
      be.gelu_backward(d.data(), aux.data(), x.data(), mn);
      return;
    }
  }
}

// One f32-D case, fused against unfused; with_c: beta 1 and C != D (the residual add).
template <typename In>
void check_f32(const Case& t, GemmEpilogue kind, const std::vector<In>& a, const std::vector<In>& b,
               bool with_c) {
  Backend& be = cpu_backend();
  GemmArgs g = t.g;
  if (kind == GemmEpilogue::bgrad) g.trans_a = true;  // A stored [k, m], as a weight gradient
  const bool gelu = kind == GemmEpilogue::bias_gelu || kind == GemmEpilogue::dgelu;
  with_c = with_c && !gelu;
  if (with_c) g.beta = 1.0f;
  const size_t mn = static_cast<size_t>(g.m * g.n);
  std::vector<float> d_want(mn, 7.0f), aux_want = t.pre, dbias_want = t.dbias0;
  unfused_f32(be, g, kind, t, a.data(), b.data(), with_c ? t.c.data() : nullptr, d_want, aux_want,
              dbias_want);
  std::vector<float> d(mn, -3.0f), aux = t.pre, dbias = t.dbias0;
  GemmEpilogueArgs ep{kind, with_c ? t.c.data() : nullptr, t.bias.data(), dbias.data()};
  be.gemm_epilogue(g, ep, a.data(), b.data(), d.data(), gelu ? aux.data() : nullptr);
  const std::string what = std::string(gemm_epilogue_name(kind)) + " m " + std::to_string(g.m) +
                           " n " + std::to_string(g.n) + " k " + std::to_string(g.k) +
                           (with_c ? " C != D" : "");
  EXPECT_EQ(d, d_want) << what;
  EXPECT_EQ(aux, aux_want) << what;
  EXPECT_EQ(dbias, dbias_want) << what;
}

TEST(GemmEpilogue, F32InputsMatchTheUnfusedOpsBitForBit) {
  uint64_t seed = 100;
  for (const Shape& s : kShapes) {
    const Case t(s, seed += 10);
    for (GemmEpilogue kind : kF32Kinds) {
      check_f32<float>(t, kind, t.a, t.b, false);
      check_f32<float>(t, kind, t.a, t.b, true);
    }
  }
}

TEST(GemmEpilogue, Bf16InputsF32OutputMatchTheUnfusedOpsBitForBit) {
  uint64_t seed = 200;
  for (const Shape& s : kShapes) {
    const Case t(s, seed += 10);
    const auto a = to_bf16(t.a), b = to_bf16(t.b);
    for (GemmEpilogue kind : kF32Kinds) {
      check_f32<bf16>(t, kind, a, b, false);
      check_f32<bf16>(t, kind, a, b, true);
    }
  }
}

// A bf16 D: the unfused ops are the f32 GEMM into a scratch, then the bf16-storing ops.
TEST(GemmEpilogue, Bf16OutputMatchesTheUnfusedOpsBitForBit) {
  Backend& be = cpu_backend();
  uint64_t seed = 300;
  for (const Shape& s : kShapes) {
    const Case t(s, seed += 10);
    const auto a = to_bf16(t.a), b = to_bf16(t.b);
    const GemmArgs g = t.g;
    const int64_t mn = g.m * g.n;
    for (GemmEpilogue kind :
         {GemmEpilogue::none, GemmEpilogue::bias, GemmEpilogue::bias_gelu, GemmEpilogue::dgelu}) {
      std::vector<float> x(static_cast<size_t>(mn));
      be.gemm(g, a.data(), b.data(), x.data());
      std::vector<bf16> d_want(static_cast<size_t>(mn)), aux_want = to_bf16(t.pre);
      if (kind == GemmEpilogue::bias || kind == GemmEpilogue::bias_gelu)
        be.add_bias(x.data(), t.bias.data(), g.m, g.n);
      if (kind == GemmEpilogue::bias_gelu) {
        be.f32_to_bf16(aux_want.data(), x.data(), mn);
        be.gelu_forward(d_want.data(), x.data(), mn);
      } else if (kind == GemmEpilogue::dgelu) {
        std::vector<float> pre(static_cast<size_t>(mn));
        be.bf16_to_f32(pre.data(), aux_want.data(), mn);
        be.gelu_backward(d_want.data(), pre.data(), x.data(), mn);
      } else {
        be.f32_to_bf16(d_want.data(), x.data(), mn);
      }
      const bool gelu = kind == GemmEpilogue::bias_gelu || kind == GemmEpilogue::dgelu;
      std::vector<bf16> d(static_cast<size_t>(mn)), aux = to_bf16(t.pre);
      GemmEpilogueArgs ep{kind, nullptr, t.bias.data(), nullptr};
      be.gemm_epilogue(g, ep, a.data(), b.data(), d.data(), gelu ? aux.data() : nullptr);
      const std::string what = std::string(gemm_epilogue_name(kind)) + " m " + std::to_string(g.m) +
                               " n " + std::to_string(g.n);
      EXPECT_EQ(bits(d), bits(d_want)) << what;
      EXPECT_EQ(bits(aux), bits(aux_want)) << what;
    }
  }
}

// A bf16 D with a bf16 C (bf16 precision's residual add, D = alpha A B + C (+ bias)): the f32
// epilogue's value with the widened C, rounded once, bit for bit; with C apart from D and in
// place (C is D), alpha other than 1, and for kind none a D wider than n (ldc > n, the gap
// untouched).
TEST(GemmEpilogue, Bf16ResidualAddIsTheF32EpilogueRoundedOnce) {
  Backend& be = cpu_backend();
  uint64_t seed = 400;
  for (const Shape& s : kShapes) {
    const Case t(s, seed += 10);
    const auto a = to_bf16(t.a), b = to_bf16(t.b);
    for (GemmEpilogue kind : {GemmEpilogue::none, GemmEpilogue::bias}) {
      for (const bool in_place : {false, true}) {
        GemmArgs g = t.g;
        g.beta = 1.0f;
        g.alpha = in_place ? 0.625f : 1.0f;
        if (kind == GemmEpilogue::none && !in_place) g.ldc = g.n + 3;
        const int64_t ld = g.ldc ? g.ldc : g.n, span = (g.m - 1) * ld + g.n;
        // C at D's layout (the gap included, so it shows if written).
        std::vector<float> c_f32(static_cast<size_t>(span));
        for (int64_t i = 0; i < span; ++i)
          c_f32[i] = t.c[i % (g.m * g.n)];
        const std::vector<bf16> c = to_bf16(c_f32);
        std::vector<float> x(static_cast<size_t>(span));
        for (int64_t i = 0; i < span; ++i)
          x[i] = kmath::float_from_bf16(c[i]);
        be.gemm_epilogue(g, {kind, nullptr, t.bias.data(), nullptr}, a.data(), b.data(), x.data(),
                         nullptr);  // f32 D in place from the widened C
        const std::vector<bf16> want = to_bf16(x);
        // D apart starts as NaNs, so an element written in the gap (or not written) shows.
        std::vector<bf16> d = in_place ? c : std::vector<bf16>(static_cast<size_t>(span), {0x7FC1});
        GemmEpilogueArgs ep{kind, nullptr, t.bias.data(), nullptr, in_place ? nullptr : c.data()};
        be.gemm_epilogue(g, ep, a.data(), b.data(), d.data(), nullptr);
        const std::string what = std::string(gemm_epilogue_name(kind)) + " m " +
                                 std::to_string(g.m) + " n " + std::to_string(g.n) +
                                 (in_place ? " in place" : " C != D");
        for (int64_t row = 0; row < g.m; ++row)
          for (int64_t j = 0; j < g.n; ++j)
            ASSERT_EQ(d[row * ld + j].bits, want[row * ld + j].bits)
                << what << " row " << row << " col " << j;
        for (int64_t row = 0; row + 1 < g.m; ++row)
          for (int64_t j = g.n; j < ld; ++j)
            ASSERT_EQ(d[row * ld + j].bits, in_place ? c[row * ld + j].bits : uint16_t{0x7FC1})
                << what << " wrote the gap at row " << row;
      }
    }
  }
}

// The f32 kinds against their definitions in float64 (X = A B + C + bias, gelu_tanh and its
// derivative in double): within f32 accumulation over k plus a few ulps of the activation.
TEST(GemmEpilogue, F32KindsMatchTheirDefinitionInFloat64) {
  Backend& be = cpu_backend();
  const Case t({false, true, 23, 31, 17}, 900);
  GemmArgs g = t.g;
  const int64_t M = g.m, N = g.n, K = g.k;
  std::vector<double> x(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t p = 0; p < K; ++p)
        s += double(t.a[i * K + p]) * double(t.b[j * K + p]);  // B stored [n, k]
      x[i * N + j] = s;
    }
  auto close = [](double got, double want) {
    return std::abs(got - want) <= 2e-6 * std::max(1.0, std::abs(want));
  };
  {
    std::vector<float> d(static_cast<size_t>(M * N)), pre(d.size());
    GemmEpilogueArgs ep{GemmEpilogue::bias_gelu, nullptr, t.bias.data(), nullptr};
    be.gemm_epilogue(g, ep, t.a.data(), t.b.data(), d.data(), pre.data());
    for (int64_t i = 0; i < M * N; ++i) {
      const double u = x[i] + t.bias[i % N];
      ASSERT_TRUE(close(pre[i], u)) << i;
      ASSERT_TRUE(close(d[i], kmath::gelu_tanh(u))) << i << " " << d[i];
    }
  }
  {
    std::vector<float> d(static_cast<size_t>(M * N)), pre = t.pre;
    GemmEpilogueArgs ep{GemmEpilogue::dgelu, nullptr, nullptr, nullptr};
    be.gemm_epilogue(g, ep, t.a.data(), t.b.data(), d.data(), pre.data());
    for (int64_t i = 0; i < M * N; ++i)
      ASSERT_TRUE(close(d[i], kmath::gelu_tanh_grad(double(pre[i])) * x[i])) << i;
  }
  {
    g.beta = 1.0f;
    std::vector<float> d(static_cast<size_t>(M * N));
    GemmEpilogueArgs ep{GemmEpilogue::bias, t.c.data(), t.bias.data(), nullptr};
    be.gemm_epilogue(g, ep, t.a.data(), t.b.data(), d.data(), nullptr);
    for (int64_t i = 0; i < M * N; ++i)
      ASSERT_TRUE(close(d[i], x[i] + t.c[i] + t.bias[i % N])) << i;
  }
}

TEST(GemmEpilogue, RefusesWhatAKindCannotDo) {
  Backend& be = cpu_backend();
  const Case t({false, true, 4, 8, 3}, 50);
  std::vector<float> d(32), aux(32), dbias(8);
  std::vector<bf16> d16(32), aux16(32);
  const auto a16 = to_bf16(t.a), b16 = to_bf16(t.b);
  auto refused = [](auto call, const std::string& needle) {
    try {
      call();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "not refused: " << needle;
  };
  GemmArgs g = t.g;
  refused(
      [&] { be.gemm_epilogue(g, {GemmEpilogue::bias}, t.a.data(), t.b.data(), d.data(), nullptr); },
      "gemm_epilogue(bias, m=4, n=8, k=3, f32 D): no bias");
  refused(
      [&] {
        be.gemm_epilogue(g, {GemmEpilogue::dgelu}, t.a.data(), t.b.data(), d.data(), nullptr);
      },
      "no aux");
  refused(
      [&] {
        be.gemm_epilogue(g, {GemmEpilogue::bgrad, nullptr, nullptr, dbias.data()}, t.a.data(),
                         t.b.data(), d.data(), nullptr);
      },
      "trans_a");
  GemmArgs batched = g;
  batched.batch = 2;
  batched.stride_a = 12, batched.stride_b = 24, batched.stride_c = 32;
  refused([&] { be.gemm_epilogue(batched, {}, t.a.data(), t.b.data(), d.data(), nullptr); },
          "one matrix only");
  GemmArgs beta = g;
  beta.beta = 1.0f;
  refused(
      [&] {
        be.gemm_epilogue(beta, {GemmEpilogue::bias_gelu, nullptr, t.bias.data(), nullptr},
                         t.a.data(), t.b.data(), d.data(), aux.data());
      },
      "beta must be 0");
  refused(
      [&] {
        be.gemm_epilogue(beta, {GemmEpilogue::none, t.c.data()}, a16.data(), b16.data(), d16.data(),
                         nullptr);
      },
      "a bf16 D takes a bf16 C");
  refused(
      [&] {
        be.gemm_epilogue(beta, {GemmEpilogue::none, nullptr, nullptr, nullptr, d16.data()},
                         a16.data(), b16.data(), d.data(), nullptr);
      },
      "needs a bf16 D");
  refused(
      [&] {
        be.gemm_epilogue(beta, {GemmEpilogue::bias_gelu, nullptr, t.bias.data()}, a16.data(),
                         b16.data(), d16.data(), aux16.data());
      },
      "beta must be 0");
  GemmArgs padded = g;
  padded.ldc = 10;
  refused(
      [&] {
        be.gemm_epilogue(padded, {GemmEpilogue::bias, nullptr, t.bias.data(), nullptr}, t.a.data(),
                         t.b.data(), d.data(), nullptr);
      },
      "packed D");
}

}  // namespace
}  // namespace core
