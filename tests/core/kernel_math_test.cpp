// The shared row-wise helpers of kernel_math.h that the CUDA kernels use and the CPU kernels do
// not (online softmax, the per-pair rotary, Adam moments), checked here so that the
// GPU math is covered on every CPU run.
#include "core/kernel_math.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/cpu/attention_kernels.h"
#include "grad_check.h"

namespace {

namespace kmath = core::kmath;
using core::test::random_vec;

TEST(KernelMath, OnlineSoftmaxMatchesLogSumExp) {
  std::vector<double> x = random_vec(57, 2, 20.0);
  double mx = -INFINITY, s = 0.0;
  for (double v : x)
    mx = std::max(mx, v);
  for (double v : x)
    s += std::exp(v - mx);
  double lse = mx + std::log(s);
  kmath::OnlineSoftmax<double> all, a, b;
  for (size_t i = 0; i < x.size(); ++i) {
    all.add(x[i]);
    (i % 3 == 0 ? a : b).add(x[i]);
  }
  a.merge(b);
  a.add(-INFINITY);  // a masked entry contributes nothing
  EXPECT_NEAR(all.log_sum_exp(), lse, 1e-12 * std::abs(lse));
  EXPECT_NEAR(a.log_sum_exp(), lse, 1e-12 * std::abs(lse));
}

// The per-pair rotary (CUDA) equals the table-driven CPU kernel, and its inverse undoes it.
TEST(KernelMath, RotaryPairMatchesCpuKernel) {
  const int64_t T = 9, hd = 8, half = hd / 2;
  std::vector<double> x = random_vec(T * hd, 3), y(T * hd);
  core::cpu::rotary_forward(y.data(), x.data(), 1, T, hd, 10000.0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < half; ++j) {
      double x0 = x[t * hd + j], x1 = x[t * hd + j + half];
      kmath::rotary_pair(x0, x1, t, j, half, 10000.0, false);
      EXPECT_NEAR(x0, y[t * hd + j], 1e-14);
      EXPECT_NEAR(x1, y[t * hd + j + half], 1e-14);
      kmath::rotary_pair(x0, x1, t, j, half, 10000.0, true);
      EXPECT_NEAR(x0, x[t * hd + j], 1e-14);
      EXPECT_NEAR(x1, x[t * hd + j + half], 1e-14);
    }
  }
}

// The truncated rotary (the record's): the first hd/4 pairs turn at torch.linspace's
// frequencies (1/base)^(j / (hd/4 - 1)), the last at exactly 1/base, the other pairs not at all.
TEST(KernelMath, TruncatedRotaryFrequencies) {
  const int64_t hd = 16, half = hd / 2;
  for (int64_t j = 0; j < half; ++j) {
    const double f = kmath::rotary_inv_freq(j, half, 1024.0, true);
    if (j < 4)
      EXPECT_NEAR(f, std::pow(1.0 / 1024.0, static_cast<double>(j) / 3.0), 1e-15) << j;
    else
      EXPECT_EQ(f, 0.0) << j;
  }
  EXPECT_NEAR(kmath::rotary_inv_freq(3, half, 1024.0, true), 1.0 / 1024.0, 1e-18);
  std::vector<double> x = random_vec(5 * hd, 4), y(5 * hd);
  core::cpu::rotary_forward(y.data(), x.data(), 1, 5, hd, 1024.0, true);
  for (int64_t t = 0; t < 5; ++t)
    for (int64_t j = 4; j < half; ++j) {
      EXPECT_EQ(y[t * hd + j], x[t * hd + j]);
      EXPECT_EQ(y[t * hd + j + half], x[t * hd + j + half]);
    }
}

// Every finite value of a format, decoded from its bits: sign, exponent (bias), mantissa.
std::vector<double> fp8_grid(kmath::Fp8 format) {
  const bool e4m3 = format == kmath::Fp8::E4M3;
  const int mbits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15, emax = e4m3 ? 15 : 31;
  std::vector<double> grid;
  for (int code = 0; code < 128; ++code) {
    const int e = code >> mbits, m = code & ((1 << mbits) - 1);
    if (e4m3 ? (e == emax && m == (1 << mbits) - 1) : e == emax) continue;  // NaN / infinity
    const double frac = static_cast<double>(m) / (1 << mbits);
    grid.push_back(e == 0 ? std::ldexp(frac, 1 - bias) : std::ldexp(1.0 + frac, e - bias));
  }
  return grid;  // ascending; grid[i] has code i: the even codes are the even mantissas
}

// kmath::fp8_value against the decoded grids: each value is kept, each point between two
// neighbours goes to the nearer, a midpoint to the even code, beyond the largest value it
// saturates, signs are symmetric and NaN stays NaN.
TEST(KernelMath, Fp8ValueIsTheNearestOfTheFormat) {
  for (kmath::Fp8 format : {kmath::Fp8::E4M3, kmath::Fp8::E5M2}) {
    const std::vector<double> grid = fp8_grid(format);
    ASSERT_EQ(grid.back(), format == kmath::Fp8::E4M3 ? 448.0 : 57344.0);
    for (size_t i = 0; i < grid.size(); ++i) {
      const float v = static_cast<float>(grid[i]);
      ASSERT_EQ(kmath::fp8_value(v, format), v) << v;
      ASSERT_EQ(kmath::fp8_value(-v, format), -v) << v;
      if (i + 1 == grid.size()) continue;
      const double lo = grid[i], hi = grid[i + 1], mid = 0.5 * (lo + hi);
      const float even = static_cast<float>(i % 2 == 0 ? lo : hi);
      ASSERT_EQ(kmath::fp8_value(static_cast<float>(mid), format), even) << mid;
      ASSERT_EQ(kmath::fp8_value(static_cast<float>(lo + 0.3 * (hi - lo)), format), lo) << lo;
      ASSERT_EQ(kmath::fp8_value(static_cast<float>(lo + 0.7 * (hi - lo)), format), hi) << lo;
    }
    const float largest = static_cast<float>(grid.back());
    EXPECT_EQ(kmath::fp8_value(largest * 1.07f, format), largest);
    EXPECT_EQ(kmath::fp8_value(-1e30f, format), -largest);
    EXPECT_EQ(kmath::fp8_value(INFINITY, format), largest);
    EXPECT_TRUE(std::isnan(kmath::fp8_value(NAN, format)));
  }
}

// The FP8 bytes (kmath::fp8_from_float, float_from_fp8) are the formats' codes: code i of the
// grid decodes to grid[i] (the sign bit negates, zero included), each finite code encodes back
// to itself, the non-finite codes decode to NaN (e5m2: +-infinity at S.11111.00), and NaN
// encodes to a NaN code.
TEST(KernelMath, Fp8BitsAreTheFormatsCodes) {
  for (kmath::Fp8 format : {kmath::Fp8::E4M3, kmath::Fp8::E5M2}) {
    const std::vector<double> grid = fp8_grid(format);
    for (int code = 0; code < 256; ++code) {
      const core::fp8 b{static_cast<uint8_t>(code)};
      const float v = kmath::float_from_fp8(b, format);
      const size_t magnitude = static_cast<size_t>(code & 0x7F);
      if (magnitude < grid.size()) {
        ASSERT_EQ(std::fabs(v), static_cast<float>(grid[magnitude])) << code;
        ASSERT_EQ(std::signbit(v), code >= 128) << code;
        ASSERT_EQ(kmath::fp8_from_float(v, format).bits, code) << code;
      } else if (format == kmath::Fp8::E5M2 && magnitude == 0x7C) {
        ASSERT_EQ(v, code >= 128 ? -INFINITY : INFINITY) << code;
      } else {
        ASSERT_TRUE(std::isnan(v)) << code;
      }
    }
    EXPECT_TRUE(std::isnan(kmath::float_from_fp8(kmath::fp8_from_float(NAN, format), format)));
    EXPECT_EQ(kmath::fp8_from_float(INFINITY, format).bits, grid.size() - 1);
  }
}

// Decoding the bytes gives exactly kmath::fp8_value (the values the FP8 GEMMs multiply), bit for
// bit, over a sweep of float bit patterns of every exponent and sign (NaN to NaN).
TEST(KernelMath, Fp8BitsDecodeToTheRoundedValue) {
  for (kmath::Fp8 format : {kmath::Fp8::E4M3, kmath::Fp8::E5M2}) {
    for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4099) {
      const float x = kmath::float_from_bits(static_cast<uint32_t>(u));
      const float want = kmath::fp8_value(x, format);
      const float got = kmath::float_from_fp8(kmath::fp8_from_float(x, format), format);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(got)) << u;
      } else {
        ASSERT_EQ(kmath::float_bits(got), kmath::float_bits(want)) << u;
      }
    }
  }
}

TEST(KernelMath, SoftcapGradientFromOutput) {
  for (double z : {-40.0, -3.0, -0.1, 0.0, 0.7, 12.0}) {
    double cap = 15.0, zc = kmath::softcap(z, cap);
    EXPECT_NEAR(kmath::softcap_grad_from_output(zc, cap), kmath::softcap_grad(z, cap), 1e-15);
    EXPECT_EQ(kmath::softcap(z, 0.0), z);
    EXPECT_EQ(kmath::softcap_grad(z, 0.0), 1.0);
  }
}

}  // namespace
