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

TEST(KernelMath, SoftcapGradientFromOutput) {
  for (double z : {-40.0, -3.0, -0.1, 0.0, 0.7, 12.0}) {
    double cap = 15.0, zc = kmath::softcap(z, cap);
    EXPECT_NEAR(kmath::softcap_grad_from_output(zc, cap), kmath::softcap_grad(z, cap), 1e-15);
    EXPECT_EQ(kmath::softcap(z, 0.0), z);
    EXPECT_EQ(kmath::softcap_grad(z, 0.0), 1.0);
  }
}

}  // namespace
