// The FP8 GEMM family on the CPU (core/ops/gemm.h): fp8_encode stores the bits of the rounded
// values, and gemm_fp8 is bit for bit the f32 GEMM of the rounded values with the same arguments
// (the FP8 head's computation before its operands were stored as bytes) in the head's three
// products; the argument checks; the refusal line for a GPU without FP8 tensor cores. The device
// scales of model.mlp_fp8: abs_max, fp8_scale_from_amax, fp8_encode_scaled and gemm_fp8_scaled
// against their float64 definitions and the host-scale forms.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/check.h"
#include "core/kernel_math.h"
#include "tests/backend_test_data.h"

namespace {

using core::fp8;
using core::GemmArgs;
using core::kmath::Fp8;
using test_data::random_vector;

// kmath::fp8_value(x / scale) element by element: the rounded operand as floats.
std::vector<float> rounded(const std::vector<float>& x, float scale, Fp8 format) {
  std::vector<float> r(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    r[i] = core::kmath::fp8_value(x[i] / scale, format);
  return r;
}

std::vector<fp8> encoded(const std::vector<float>& x, float scale, Fp8 format) {
  std::vector<fp8> b(x.size());
  core::cpu_backend().fp8_encode(b.data(), x.data(), static_cast<int64_t>(x.size()), scale, format);
  return b;
}

TEST(Fp8Gemm, EncodeStoresTheBitsOfTheRoundedValues) {
  auto x = random_vector(3001, 5);
  for (size_t i = 0; i < x.size(); ++i)  // every binade from subnormal to saturated
    x[i] = std::ldexp(x[i], static_cast<int>(i % 44) - 24);
  for (Fp8 format : {Fp8::E4M3, Fp8::E5M2}) {
    const std::vector<fp8> b = encoded(x, 0.37f, format);
    const std::vector<float> want = rounded(x, 0.37f, format);
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(core::kmath::float_from_fp8(b[i], format), want[i]) << i;
    // From bf16: the widened value (exact) rounded the same way.
    std::vector<core::bf16> xb(x.size());
    std::vector<float> widened(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      xb[i] = core::kmath::bf16_from_float(x[i]);
      widened[i] = core::kmath::float_from_bf16(xb[i]);
    }
    std::vector<fp8> from_bf16(x.size());
    core::cpu_backend().fp8_encode(from_bf16.data(), xb.data(), static_cast<int64_t>(x.size()),
                                   0.37f, format);
    const std::vector<fp8> want_bf16 = encoded(widened, 0.37f, format);
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(from_bf16[i].bits, want_bf16[i].bits) << i;
  }
}

// The FP8 head's products (model/gpt.cpp) at N = 37 rows, D = 48, Vp = 256: logits = a Xq Wq^T,
// d x = a G Wq, d W += a G^T Xq (into a non-zero d W), each with gemm_fp8 on the bytes and with
// the f32 GEMM on the rounded floats: equal bit for bit.
TEST(Fp8Gemm, EqualsTheF32GemmOfTheRoundedValuesInTheHeadsProducts) {
  core::Backend& cpu = core::cpu_backend();
  const int64_t N = 37, D = 48, Vp = 256;
  const float xs = 0.02f, ws = 24.0f / 448.0f, gs = 1.0f / 448.0f;
  const auto x = random_vector(N * D, 11), w = random_vector(Vp * D, 12, 0.3f);
  const auto dz = random_vector(N * Vp, 13, 0.002f);
  struct Product {
    GemmArgs args;
    const std::vector<float>& a;
    float a_scale;
    Fp8 a_format;
    const std::vector<float>& b;
    float b_scale;
    int64_t c_size;
  };
  GemmArgs fwd, dx, dw;
  fwd.trans_b = true, fwd.m = N, fwd.n = Vp, fwd.k = D, fwd.alpha = 1.3f * xs * ws;
  fwd.fp8_fast_accum = true;
  dx.m = N, dx.n = D, dx.k = Vp, dx.alpha = gs * ws;
  dw.trans_a = true, dw.m = Vp, dw.n = D, dw.k = N, dw.alpha = gs * xs, dw.beta = 1.0f;
  const Product products[] = {{fwd, x, xs, Fp8::E4M3, w, ws, N * Vp},
                              {dx, dz, gs, Fp8::E5M2, w, ws, N * D},
                              {dw, dz, gs, Fp8::E5M2, x, xs, Vp * D}};
  for (const Product& p : products) {
    const std::vector<float> c0 = random_vector(p.c_size, 14);
    std::vector<float> want = c0, got = c0;
    GemmArgs f32 = p.args;
    f32.fp8_fast_accum = false;
    cpu.gemm(f32, rounded(p.a, p.a_scale, p.a_format).data(),
             rounded(p.b, p.b_scale, Fp8::E4M3).data(), want.data());
    cpu.gemm_fp8(p.args, encoded(p.a, p.a_scale, p.a_format).data(), p.a_format,
                 encoded(p.b, p.b_scale, Fp8::E4M3).data(), Fp8::E4M3, got.data());
    ASSERT_EQ(got, want) << "m=" << p.args.m << " n=" << p.args.n << " k=" << p.args.k;
  }
}

TEST(Fp8Gemm, RefusesE5m2TimesE5m2AndBatches) {
  std::vector<fp8> a(16), b(16);
  std::vector<float> c(16);
  GemmArgs g;
  g.m = 4, g.n = 4, g.k = 4;
  try {
    core::cpu_backend().gemm_fp8(g, a.data(), Fp8::E5M2, b.data(), Fp8::E5M2, c.data());
    FAIL() << "e5m2 x e5m2 accepted";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "gemm_fp8(m=4, n=4, k=4): e5m2 x e5m2 is not an FP8 GEMM (one operand must "
                  "be e4m3)"),
              std::string::npos)
        << e.what();
  }
  g.batch = 2, g.stride_c = 16;
  EXPECT_THROW(core::cpu_backend().gemm_fp8(g, a.data(), Fp8::E4M3, b.data(), Fp8::E5M2, c.data()),
               core::Error);
}

// A GPU below compute capability 8.9 is named with its capability; from 8.9 on (Ada, Hopper,
// Blackwell) and on the CPU (software rounding) nothing is missing.
TEST(Fp8Gemm, MissingReasonNamesTheGpuAndItsCapability) {
  EXPECT_EQ(core::fp8_gemm_missing_reason("cuda:0 (NVIDIA A100-SXM4-80GB)", 80),
            "cuda:0 (NVIDIA A100-SXM4-80GB) has compute capability 8.0; FP8 tensor cores need "
            "8.9 or later");
  EXPECT_EQ(core::fp8_gemm_missing_reason("cuda:1 (NVIDIA GeForce RTX 3090)", 86),
            "cuda:1 (NVIDIA GeForce RTX 3090) has compute capability 8.6; FP8 tensor cores need "
            "8.9 or later");
  for (int cc : {89, 90, 100, 120})
    EXPECT_EQ(core::fp8_gemm_missing_reason("gpu", cc), "") << cc;
  EXPECT_EQ(core::cpu_backend().fp8_gemm_missing_reason(), "");
}

// abs_max is max |x| exactly (float64 over the same values), from f32 and from bf16, with the
// largest magnitude negative, in the middle of a parallel range, at the end; 0 for no elements; a
// NaN wins.
TEST(Fp8Scaling, AbsMaxIsTheLargestMagnitude) {
  core::Backend& be = core::cpu_backend();
  for (int64_t n : {int64_t{1}, int64_t{37}, int64_t{100003}}) {
    for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
      std::vector<float> x = random_vector(static_cast<size_t>(n), 3);
      x[static_cast<size_t>(at)] = -9.75f;
      double want = 0;
      for (float v : x)
        want = std::max(want, std::fabs(double(v)));
      float got = -1.0f;
      be.abs_max(&got, x.data(), n);
      EXPECT_EQ(double(got), want) << n << " " << at;
      std::vector<core::bf16> xb(x.size());
      double want_bf16 = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        xb[i] = core::kmath::bf16_from_float(x[i]);
        want_bf16 = std::max(want_bf16, std::fabs(double(core::kmath::float_from_bf16(xb[i]))));
      }
      be.abs_max(&got, xb.data(), n);
      EXPECT_EQ(double(got), want_bf16) << n << " " << at;
    }
  }
  float got = -1.0f;
  be.abs_max(&got, static_cast<const float*>(nullptr), 0);
  EXPECT_EQ(got, 0.0f);
  std::vector<float> x = {1.0f, std::nanf(""), -3.0f};
  be.abs_max(&got, x.data(), 3);
  EXPECT_TRUE(std::isnan(got));
}

// scale = max(amax, 1e-12) * factor, in f32 (the record's clamp), element by element.
TEST(Fp8Scaling, ScaleFromAmaxClampsThenMultiplies) {
  const std::vector<float> amax = {0.0f, 1e-13f, 1e-12f, 3.5f, 448.0f};
  const float factor = 1.80f / 448.0f;
  std::vector<float> scale(amax.size());
  core::cpu_backend().fp8_scale_from_amax(scale.data(), amax.data(), 5, factor);
  for (size_t i = 0; i < amax.size(); ++i)
    EXPECT_EQ(scale[i], std::max(amax[i], 1e-12f) * factor) << i;
}

// fp8_encode_scaled with the scale in device memory is fp8_encode with it on the host, bit for
// bit, from f32 and bf16; values beyond 448 s saturate to +-448 (the record's clamps).
TEST(Fp8Scaling, EncodeScaledIsTheHostScaleEncode) {
  core::Backend& be = core::cpu_backend();
  std::vector<float> x = random_vector(2000, 9);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = std::ldexp(x[i], static_cast<int>(i % 30) - 12);
  const float scale = 0.113f;
  std::vector<fp8> got(x.size()), want = encoded(x, scale, Fp8::E4M3);
  be.fp8_encode_scaled(got.data(), x.data(), static_cast<int64_t>(x.size()), &scale, Fp8::E4M3);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(got[i].bits, want[i].bits) << i;
    if (std::fabs(x[i] / scale) > 448.0f) {
      ASSERT_EQ(std::fabs(core::kmath::float_from_fp8(got[i], Fp8::E4M3)), 448.0f) << i;
    }
  }
  std::vector<core::bf16> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    xb[i] = core::kmath::bf16_from_float(x[i]);
  std::vector<fp8> want_bf16(x.size());
  be.fp8_encode(want_bf16.data(), xb.data(), static_cast<int64_t>(x.size()), scale, Fp8::E4M3);
  be.fp8_encode_scaled(got.data(), xb.data(), static_cast<int64_t>(x.size()), &scale, Fp8::E4M3);
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(got[i].bits, want_bf16[i].bits) << i;
}

// gemm_fp8_scaled is gemm_fp8 with alpha (alpha s_a) s_b, bit for bit (beta 1 into a non-zero C),
// and within 1e-6 of the float64 sum s_a s_b sum Aq Bq over the decoded bytes.
TEST(Fp8Scaling, ScaledGemmIsTheGemmWithTheScalesInAlpha) {
  core::Backend& be = core::cpu_backend();
  const int64_t m = 19, n = 24, k = 40;
  const float sa = 0.0123f, sb = 3.5f / 448.0f;
  const std::vector<fp8> a = encoded(random_vector(m * k, 11), 0.01f, Fp8::E4M3);
  const std::vector<fp8> b = encoded(random_vector(n * k, 12), 0.02f, Fp8::E4M3);
  GemmArgs g;
  g.trans_b = true, g.m = m, g.n = n, g.k = k, g.alpha = 0.7f, g.beta = 1.0f;
  const std::vector<float> c0 = random_vector(m * n, 13);
  std::vector<float> got = c0, want = c0;
  be.gemm_fp8_scaled(g, a.data(), Fp8::E4M3, &sa, b.data(), Fp8::E4M3, &sb, got.data());
  GemmArgs folded = g;
  folded.alpha = g.alpha * sa * sb;
  be.gemm_fp8(folded, a.data(), Fp8::E4M3, b.data(), Fp8::E4M3, want.data());
  EXPECT_EQ(got, want);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double dot = 0, mag = 0;
      for (int64_t p = 0; p < k; ++p) {
        const double v = double(core::kmath::float_from_fp8(a[i * k + p], Fp8::E4M3)) *
                         core::kmath::float_from_fp8(b[j * k + p], Fp8::E4M3);
        dot += v;
        mag += std::fabs(v);
      }
      const double ref = 0.7 * double(sa) * double(sb) * dot + c0[i * n + j];
      EXPECT_NEAR(got[i * n + j], ref, 1e-6 * (0.7 * sa * sb * mag + std::fabs(c0[i * n + j])));
    }
}

}  // namespace
