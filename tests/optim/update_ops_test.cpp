// AdamW's and Muon's element-wise ops on the CPU: bit for bit the host loops the optimizers ran
// before these ops existed (copied below as the references, so the golden trajectories stay
// exactly where they were), and the properties their formulas promise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "optim/adamw/adamw_ops.h"
#include "optim/muon/muon_ops.h"
#include "tests/core/grad_check.h"

namespace {

using core::test::random_vec;
using FVec = std::vector<float>;
namespace kmath = optim::kmath;

optim::AdamWOps& adamw_ops() {
  static const std::unique_ptr<optim::AdamWOps> ops = optim::make_adamw_ops(core::cpu_backend());
  return *ops;
}

optim::MuonOps& muon_ops() {
  static const std::unique_ptr<optim::MuonOps> ops = optim::make_muon_ops(core::cpu_backend());
  return *ops;
}

bool bitwise_equal(const FVec& a, const FVec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// ---- AdamW --------------------------------------------------------------------------------------

struct AdamWMode {
  bool torch_eps;
  bool cautious_wd;
};

// The AdamW step as optim/adamw/adamw.cpp ran it as a host loop (the reference trajectory).
void adamw_host_loop(FVec& w, FVec& m, FVec& v, const FVec& g, int64_t t, double lr, double wd,
                     double b1, double b2, double eps, AdamWMode mode) {
  const double decay = mode.cautious_wd ? 1.0 : 1.0 - lr * wd;
  const double cautious = mode.cautious_wd ? lr * lr * wd : 0.0;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(t));
  const double step_size = mode.torch_eps ? lr / bc1 : lr * std::sqrt(bc2) / bc1;
  const double v_scale = mode.torch_eps ? 1.0 / std::sqrt(bc2) : 1.0;
  for (size_t i = 0; i < w.size(); ++i) {
    const double gi = g[i];
    const double mi = b1 * m[i] + (1.0 - b1) * gi;
    const double vi = b2 * v[i] + (1.0 - b2) * gi * gi;
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    const double wi = w[i];
    double u = step_size * mi / (std::sqrt(vi) * v_scale + eps);
    u += u * wi > 0 ? cautious * wi : 0.0;
    w[i] = static_cast<float>(wi * decay - u);
  }
}

// The scalars optim/adamw/adamw.cpp passes for step t.
kmath::AdamWStep adamw_step(int64_t t, double lr, double wd, double b1, double b2, double eps,
                            AdamWMode mode) {
  kmath::AdamWStep s;
  s.beta1 = b1;
  s.beta2 = b2;
  s.eps = eps;
  s.decay = mode.cautious_wd ? 1.0 : 1.0 - lr * wd;
  s.cautious = mode.cautious_wd ? lr * lr * wd : 0.0;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(t));
  s.step_size = mode.torch_eps ? lr / bc1 : lr * std::sqrt(bc2) / bc1;
  s.v_scale = mode.torch_eps ? 1.0 / std::sqrt(bc2) : 1.0;
  return s;
}

TEST(UpdateOps, AdamWUpdateIsTheHostLoopBitForBit) {
  const double lr = 3e-3, wd = 0.1, b1 = 0.9, b2 = 0.95, eps = 1e-8;
  // 70001 elements: several threads' worth, not a multiple of any vector width.
  for (int64_t n : {int64_t{1}, int64_t{37}, int64_t{70001}}) {
    for (AdamWMode mode : {AdamWMode{false, false}, AdamWMode{true, false}, AdamWMode{false, true},
                           AdamWMode{true, true}}) {
      FVec w = random_vec<float>(n, 1), m(n, 0.0f), v(n, 0.0f);
      FVec w_ref = w, m_ref = m, v_ref = v;
      for (int64_t t = 1; t <= 3; ++t) {
        // Gradients near 1e-7 too, where the two eps placements differ.
        const FVec g = random_vec<float>(n, 10 + t, t == 2 ? 1e-7 : 1.0);
        adamw_host_loop(w_ref, m_ref, v_ref, g, t, lr, wd, b1, b2, eps, mode);
        const optim::AdamWTensor tensor{
            w.data(), m.data(), v.data(), g.data(), n, adamw_step(t, lr, wd, b1, b2, eps, mode)};
        adamw_ops().update({&tensor, 1});
        const std::string where =
            "n=" + std::to_string(n) + " torch_eps=" + std::to_string(mode.torch_eps) +
            " cautious=" + std::to_string(mode.cautious_wd) + " step=" + std::to_string(t);
        EXPECT_TRUE(bitwise_equal(w, w_ref)) << where;
        EXPECT_TRUE(bitwise_equal(m, m_ref)) << where;
        EXPECT_TRUE(bitwise_equal(v, v_ref)) << where;
      }
    }
  }
}

// The gradient factor folded into the update (AdamWTensor::g_scale) leaves what the trainer's
// scaling pass followed by the update leaves, bit for bit: g * scale is the same float product.
TEST(UpdateOps, AdamWFoldedGradScaleIsTheScaledGradientBitForBit) {
  const int64_t n = 70001;
  const float scale = 0.0371f;
  FVec w = random_vec<float>(n, 1), m(n, 0.0f), v(n, 0.0f);
  FVec w_ref = w, m_ref = m, v_ref = v;
  for (int64_t t = 1; t <= 3; ++t) {
    const FVec g = random_vec<float>(n, 20 + t);
    FVec scaled = g;
    core::cpu_backend().scale(scaled.data(), scale, n);
    const kmath::AdamWStep s = adamw_step(t, 3e-3, 0.1, 0.9, 0.95, 1e-8, {false, false});
    const optim::AdamWTensor ref{w_ref.data(), m_ref.data(), v_ref.data(), scaled.data(), n, s};
    adamw_ops().update({&ref, 1});
    const optim::AdamWTensor folded{w.data(), m.data(), v.data(), g.data(), n, s, &scale};
    adamw_ops().update({&folded, 1});
    EXPECT_TRUE(bitwise_equal(w, w_ref)) << "step " << t;
    EXPECT_TRUE(bitwise_equal(m, m_ref)) << "step " << t;
    EXPECT_TRUE(bitwise_equal(v, v_ref)) << "step " << t;
  }
}

// max |a - b| over max |b|: the error on the scale of the values.
double scaled_error(const FVec& a, const FVec& b) {
  double diff = 0, size = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    size = std::max(size, std::abs(static_cast<double>(b[i])));
  }
  return diff / size;
}

// The device's float form of the element against the float64 one (the CPU's), run here on the
// host: 200 steps of random gradients in every eps and decay mode, with a beta whose complement
// loses digits in float (0.999) and a decay rate of 1e-6. Both round w, m and v to float every
// step, so the trajectories part by float ulps that walk, and stay that small.
TEST(UpdateOps, AdamWF32ElementFollowsTheF64One) {
  const int64_t n = 4096;
  for (AdamWMode mode : {AdamWMode{false, false}, AdamWMode{true, false}, AdamWMode{false, true},
                         AdamWMode{true, true}}) {
    FVec w = random_vec<float>(n, 3), m(n, 0.0f), v(n, 0.0f);
    FVec w32 = w, m32 = m, v32 = v;
    double worst_w = 0, worst_m = 0, worst_v = 0;
    for (int64_t t = 1; t <= 200; ++t) {
      const FVec g = random_vec<float>(n, 100 + t, t % 7 == 0 ? 1e-6 : 1.0);
      const kmath::AdamWStep s = adamw_step(t, 1e-4, 0.01, 0.9, 0.999, 1e-8, mode);
      const kmath::AdamWStepF32 s32 = kmath::adamw_step_f32(s);
      for (int64_t i = 0; i < n; ++i) {
        kmath::adamw_element(w[i], m[i], v[i], g[i], s);
        kmath::adamw_element_f32(w32[i], m32[i], v32[i], g[i], s32);
      }
      worst_w = std::max(worst_w, scaled_error(w32, w));
      worst_m = std::max(worst_m, scaled_error(m32, m));
      worst_v = std::max(worst_v, scaled_error(v32, v));
    }
    const std::string where = "torch_eps=" + std::to_string(mode.torch_eps) +
                              " cautious=" + std::to_string(mode.cautious_wd);
    // Measured: w 3.2e-8 (half a float ulp), m 1.4e-7, v 2.8e-7 in every mode; the forms the
    // float64 one takes drift to w 6.8e-6 and v 1.8e-6 (adamw_math.h says why).
    EXPECT_LT(worst_w, 1e-7) << where;
    EXPECT_LT(worst_m, 5e-7) << where;
    EXPECT_LT(worst_v, 5e-7) << where;
  }
}

// The element rule against the textbook formulas, written independently of the fused form.
TEST(UpdateOps, AdamWElementFollowsTheFormulas) {
  const double lr = 1e-2, wd = 0.5, b1 = 0.8, b2 = 0.9, eps = 1e-6;
  const float w0 = 0.75f, m0 = 0.1f, v0 = 0.02f, g = -0.5f;
  const int64_t t = 2;
  const double m1 = 0.8 * 0.1f + 0.2 * -0.5, v1 = 0.9 * 0.02f + 0.1 * 0.25;
  const double bc1 = 1 - 0.8 * 0.8, bc2 = 1 - 0.9 * 0.9;
  {  // spec eps, decoupled decay: W (1 - lr wd) - lr sqrt(bc2) / bc1 m / (sqrt(v) + eps)
    float w = w0, m = m0, v = v0;
    kmath::adamw_element(w, m, v, g, adamw_step(t, lr, wd, b1, b2, eps, {false, false}));
    EXPECT_NEAR(m, m1, 1e-7);
    EXPECT_NEAR(v, v1, 1e-8);
    EXPECT_NEAR(w, w0 * (1 - lr * wd) - lr * std::sqrt(bc2) / bc1 * m1 / (std::sqrt(v1) + eps),
                1e-6);
  }
  {  // torch eps: W (1 - lr wd) - lr (m / bc1) / (sqrt(v / bc2) + eps)
    float w = w0, m = m0, v = v0;
    kmath::adamw_element(w, m, v, g, adamw_step(t, lr, wd, b1, b2, eps, {true, false}));
    EXPECT_NEAR(w, w0 * (1 - lr * wd) - lr * (m1 / bc1) / (std::sqrt(v1 / bc2) + eps), 1e-6);
  }
  {  // cautious: the step u = direction is negative here (m < 0), u W < 0: no decay at all
    float w = w0, m = m0, v = v0;
    kmath::adamw_element(w, m, v, g, adamw_step(t, lr, wd, b1, b2, eps, {false, true}));
    EXPECT_NEAR(w, w0 - lr * std::sqrt(bc2) / bc1 * m1 / (std::sqrt(v1) + eps), 1e-6);
  }
  {  // cautious with W < 0: u W > 0, so u grows by lr^2 wd W
    float w = -w0, m = m0, v = v0;
    kmath::adamw_element(w, m, v, g, adamw_step(t, lr, wd, b1, b2, eps, {false, true}));
    const double u = lr * std::sqrt(bc2) / bc1 * m1 / (std::sqrt(v1) + eps);
    EXPECT_NEAR(w, -w0 - (u + lr * lr * wd * -w0), 1e-6);
  }
}

// ---- NorMuon normalisation and the cautious update ----------------------------------------------

// Muon::normalize as optim/muon/muon.cpp ran it on the host (the reference trajectory).
void normuon_host_loop(float* u, float* s, int64_t count, int64_t r, int64_t c, double b2) {
  const bool per_row = r >= c;
  const int64_t stats = per_row ? r : c;
  std::vector<double> q(static_cast<size_t>(stats));
  for (int64_t k = 0; k < count; ++k) {
    float* v = u + k * r * c;
    float* sk = s + k * stats;
    std::fill(q.begin(), q.end(), 0.0);
    double norm2 = 0;
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) {
        const double x = v[i * c + j];
        q[per_row ? i : j] += x * x;
        norm2 += x * x;
      }
    const double count_d = static_cast<double>(per_row ? c : r);
    std::vector<double> scale(static_cast<size_t>(stats));
    double scaled2 = 0;
    for (int64_t a = 0; a < stats; ++a) {
      const double sa = b2 * sk[a] + (1.0 - b2) * (q[a] / count_d);
      sk[a] = static_cast<float>(sa);
      scale[a] = 1.0 / std::sqrt(std::max(sa, 1e-10));
      scaled2 += q[a] * scale[a] * scale[a];
    }
    const double keep_norm = std::sqrt(norm2) / std::max(std::sqrt(scaled2), 1e-10);
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j)
        v[i * c + j] = static_cast<float>(v[i * c + j] * scale[per_row ? i : j] * keep_norm);
  }
}

struct MatrixShape {
  int64_t count, rows, cols;
};

// NorMuon's normalisation alone, through the update with lr 0 (w stays as it is).
void normuon_normalize(float* u, float* s, int64_t count, int64_t rows, int64_t cols,
                       double beta2) {
  FVec w(static_cast<size_t>(count * rows * cols), 1.0f);
  const optim::MuonUpdate p{w.data(), u, s, count, rows, cols, 0.0, 0.0};
  muon_ops().update({&p, 1}, beta2);
  for (float x : w)
    ASSERT_EQ(x, 1.0f);
}

// The cautious step alone: the update without second moments.
void cautious_update(float* w, float* u, int64_t n, double lr, double wd) {
  const optim::MuonUpdate p{w, u, nullptr, 1, 1, n, lr, wd};
  muon_ops().update({&p, 1}, 0.95);
}

const MatrixShape kShapes[] = {{1, 24, 8}, {3, 8, 24}, {2, 16, 16}, {1, 1, 5}, {2, 5, 1}};

TEST(UpdateOps, NormuonNormalizeIsTheHostLoopBitForBit) {
  for (MatrixShape sh : kShapes) {
    const int64_t n = sh.count * sh.rows * sh.cols;
    const int64_t stats = sh.count * std::max(sh.rows, sh.cols);
    FVec s(stats, 0.0f), s_ref(stats, 0.0f);
    for (int64_t t = 1; t <= 3; ++t) {
      FVec u = random_vec<float>(n, 20 + t), u_ref = u;
      normuon_host_loop(u_ref.data(), s_ref.data(), sh.count, sh.rows, sh.cols, 0.95);
      normuon_normalize(u.data(), s.data(), sh.count, sh.rows, sh.cols, 0.95);
      const std::string where = std::to_string(sh.count) + "x[" + std::to_string(sh.rows) + ", " +
                                std::to_string(sh.cols) + "] step " + std::to_string(t);
      EXPECT_TRUE(bitwise_equal(u, u_ref)) << where;
      EXPECT_TRUE(bitwise_equal(s, s_ref)) << where;
    }
  }
}

// With beta2 = 0 the second moment is this step's mean square per row (column), so every row
// (column) of the result has the same norm and the matrix keeps its Frobenius norm.
TEST(UpdateOps, NormuonNormalizeEqualisesRowsAndKeepsTheNorm) {
  for (MatrixShape sh : {MatrixShape{2, 12, 4}, MatrixShape{1, 4, 12}}) {
    const int64_t r = sh.rows, c = sh.cols, n = sh.count * r * c;
    const bool per_row = r >= c;
    FVec u = random_vec<float>(n, 7);
    for (int64_t i = 0; i < n; ++i)  // rows and columns of very different sizes
      u[i] *= static_cast<float>(1 + (i / c) % r + 3 * (i % c));
    const FVec before = u;
    FVec s(sh.count * std::max(r, c), 0.0f);
    normuon_normalize(u.data(), s.data(), sh.count, r, c, 0.0);
    for (int64_t k = 0; k < sh.count; ++k) {
      double norm2_before = 0, norm2_after = 0;
      std::vector<double> line2(per_row ? r : c, 0.0), mean_sq(per_row ? r : c, 0.0);
      for (int64_t i = 0; i < r; ++i)
        for (int64_t j = 0; j < c; ++j) {
          const double x = u[k * r * c + i * c + j], x0 = before[k * r * c + i * c + j];
          norm2_before += x0 * x0;
          norm2_after += x * x;
          line2[per_row ? i : j] += x * x;
          mean_sq[per_row ? i : j] += x0 * x0 / (per_row ? c : r);
        }
      EXPECT_NEAR(norm2_after, norm2_before, 1e-5 * norm2_before);
      for (size_t a = 0; a < line2.size(); ++a) {
        EXPECT_NEAR(line2[a], norm2_before / static_cast<double>(line2.size()), 1e-5 * norm2_before)
            << "matrix " << k << (per_row ? " row " : " column ") << a;
        EXPECT_NEAR(s[k * line2.size() + a], mean_sq[a], 1e-6 * mean_sq[a]);
      }
    }
  }
}

// The cautious update loop of optim/muon/muon.cpp (the reference trajectory).
void cautious_host_loop(FVec& w, const FVec& u, double lr_eff, double wd_eff) {
  for (size_t i = 0; i < w.size(); ++i) {
    const double wi = w[i], ui = u[i];
    const double mask = ui * wi >= 0 ? 1.0 : 0.0;
    w[i] = static_cast<float>(wi - lr_eff * (wd_eff * mask * wi + ui));
  }
}

TEST(UpdateOps, CautiousUpdateIsTheHostLoopBitForBit) {
  for (int64_t n : {int64_t{5}, int64_t{70001}}) {
    for (double wd : {0.0, 0.013}) {
      FVec w = random_vec<float>(n, 3), u = random_vec<float>(n, 4), w_ref = w;
      cautious_host_loop(w_ref, u, 0.02, wd);
      cautious_update(w.data(), u.data(), n, 0.02, wd);
      EXPECT_TRUE(bitwise_equal(w, w_ref)) << "n=" << n << " wd=" << wd;
    }
  }
}

TEST(UpdateOps, CautiousUpdateDecaysOnlyWhereItAgrees) {
  const double lr = 0.5, wd = 0.25;
  EXPECT_EQ(kmath::cautious_update_element(2.0f, 1.0f, lr, wd), 2.0f - 0.5f * (0.25f * 2 + 1));
  EXPECT_EQ(kmath::cautious_update_element(2.0f, -1.0f, lr, wd), 2.0f + 0.5f);  // no decay
  EXPECT_EQ(kmath::cautious_update_element(2.0f, 1.0f, lr, 0.0), 1.5f);         // plain step
}

}  // namespace
