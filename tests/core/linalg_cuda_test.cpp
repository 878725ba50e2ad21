// The CUDA backend's batched solvers (eigh_many: syevjBatched / syevBatched; qr_many: batched
// CholeskyQR2 with Householder for what it refuses; gram_many: batched GEMMs) against the CPU
// backend and against the same tasks one per call, on mixed sizes that include the SOAP refresh's
// (cpu_small's 128 .. 512) and ill-conditioned members. Without a device every test skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/backend.h"
#include "tests/backend_test_data.h"
#include "tests/cuda_vs_cpu.h"

namespace core {
namespace {

using test::CudaVsCpu;
using test_data::random_vector;

// G G^T / cols for a random G [n, cols]: symmetric positive semi-definite, rank min(n, cols).
std::vector<float> random_spd(int64_t n, int64_t cols, uint64_t seed) {
  const auto g = random_vector(n * cols, seed);
  std::vector<float> a(static_cast<size_t>(n * n));
  GramTask t{g.data(), a.data(), n, cols, true};
  cpu_backend().gram_many({&t, 1});
  for (float& x : a)
    x /= static_cast<float>(cols);
  return a;
}

// Largest |a - b| over entries, columns of b negated where that matches a better (eigenvectors
// and Q factors are unique up to column signs).
double max_diff_up_to_column_signs(const std::vector<float>& a, const std::vector<float>& b,
                                   int64_t rows, int64_t cols) {
  double worst = 0;
  for (int64_t j = 0; j < cols; ++j) {
    double plus = 0, minus = 0;
    for (int64_t i = 0; i < rows; ++i) {
      plus = std::max(plus, static_cast<double>(std::abs(a[i * cols + j] - b[i * cols + j])));
      minus = std::max(minus, static_cast<double>(std::abs(a[i * cols + j] + b[i * cols + j])));
    }
    worst = std::max(worst, std::min(plus, minus));
  }
  return worst;
}

// Eigenvalues of every size group (Jacobi up to 32, syevBatched above) agree with the CPU's, the
// eigenvectors satisfy A V = V diag(w), and a list gives what its tasks give one per call.
TEST_F(CudaVsCpu, EighManyBatchedAgreesWithCpuAndOneAtATime) {
  const std::vector<int64_t> sizes = {128, 7, 128, 48, 16, 48, 384, 16};
  std::vector<std::vector<float>> a;
  std::vector<float*> ga, gw, gv, gw1, gv1;
  std::vector<EighTask> tasks;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    a.push_back(random_spd(n, n + 9, 70 + i));
    ga.push_back(dev().upload(a[i]));
    gw.push_back(dev().alloc<float>(n));
    gv.push_back(dev().alloc<float>(n * n));
    gw1.push_back(dev().alloc<float>(n));
    gv1.push_back(dev().alloc<float>(n * n));
    tasks.push_back({ga[i], gw[i], gv[i], n});
  }
  gpu().eigh_many(tasks);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    const EighTask one{ga[i], gw1[i], gv1[i], n};
    gpu().eigh_many({&one, 1});
    const auto w = dev().download(gw[i], n), v = dev().download(gv[i], n * n);
    std::vector<float> w_cpu(n), v_cpu(n * n);
    cpu().eigh_many(std::vector<EighTask>{{a[i].data(), w_cpu.data(), v_cpu.data(), n}});
    EXPECT_CLOSE(w, w_cpu, 1e-4) << "n " << n;
    EXPECT_CLOSE(dev().download(gw1[i], n), w, 1e-5) << "one at a time, n " << n;
    // A V - V diag(w), relative to the largest eigenvalue.
    double worst = 0;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < n; ++c) {
        double av = 0;
        for (int64_t k = 0; k < n; ++k)
          av += static_cast<double>(a[i][r * n + k]) * v[k * n + c];
        worst = std::max(worst, std::abs(av - static_cast<double>(v[r * n + c]) * w[c]));
      }
    EXPECT_LE(worst / std::max(1e-30f, w[n - 1]), 1e-4) << "A V = V diag(w), n " << n;
  }
}

// Q <- qr(K Q).Q as the SOAP refresh asks it (left factors), batched CholeskyQR2 where it holds
// and Householder where it does not (a rank-deficient K): Q equals the CPU's up to column signs,
// R = Q^T (K Q) has a non-negative diagonal, and a list gives what its tasks give one per call.
TEST_F(CudaVsCpu, QrManyBatchedAgreesWithCpuAndOneAtATime) {
  const std::vector<std::array<int64_t, 2>> shapes = {{128, 128}, {48, 48}, {128, 128},
                                                      {40, 24},   {24, 40}, {48, 48}};
  for (const bool rank_deficient : {false, true}) {
    std::vector<std::vector<float>> k, q0;
    std::vector<float*> gk, gq, gq1;
    std::vector<QrTask> tasks;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const auto [m, n] = shapes[i];
      k.push_back(random_spd(m, rank_deficient ? m / 4 : 2 * m, 90 + i));
      q0.push_back(random_vector(m * n, 95 + i));
      gk.push_back(dev().upload(k[i]));
      gq.push_back(dev().upload(q0[i]));
      gq1.push_back(dev().upload(q0[i]));
      tasks.push_back({gq[i], gq[i], m, n, gk[i]});  // in place, as the refresh runs it
    }
    gpu().qr_many(tasks);
    for (size_t i = 0; i < shapes.size(); ++i) {
      const auto [m, n] = shapes[i];
      const int64_t r = std::min(m, n);
      const QrTask one{gq1[i], gq1[i], m, n, gk[i]};
      gpu().qr_many({&one, 1});
      std::vector<float> q_cpu(q0[i]);
      cpu().qr_many(std::vector<QrTask>{{q_cpu.data(), q_cpu.data(), m, n, k[i].data()}});
      const auto q = dev().download(gq[i], m * r);
      q_cpu.resize(static_cast<size_t>(m * r));
      if (!rank_deficient) {  // a rank-deficient product has no unique Q
        EXPECT_LE(max_diff_up_to_column_signs(q, q_cpu, m, r), 1e-3) << "Q vs CPU, task " << i;
      }
      EXPECT_LE(max_diff_up_to_column_signs(dev().download(gq1[i], m * r), q, m, r), 1e-4)
          << "one at a time, task " << i;
      // Q^T Q = I and R's diagonal q_j^T (K q0)_j >= 0.
      for (int64_t c1 = 0; c1 < r; ++c1)
        for (int64_t c2 = 0; c2 < r; ++c2) {
          double dot = 0;
          for (int64_t row = 0; row < m; ++row)
            dot += static_cast<double>(q[row * r + c1]) * q[row * r + c2];
          EXPECT_NEAR(dot, c1 == c2 ? 1.0 : 0.0, 1e-4) << "Q^T Q, task " << i;
        }
      for (int64_t j = 0; j < r; ++j) {
        double r_jj = 0;
        for (int64_t row = 0; row < m; ++row) {
          double kq = 0;
          for (int64_t l = 0; l < m; ++l)
            kq += static_cast<double>(k[i][row * m + l]) * q0[i][l * n + j];
          r_jj += q[row * r + j] * kq;
        }
        EXPECT_GE(r_jj, -1e-4) << "R's diagonal, task " << i << " column " << j;
      }
    }
  }
}

// Every shape's Gram matrices in one batched product: the CPU's (syrk) to rounding, and exactly
// symmetric.
TEST_F(CudaVsCpu, GramManyAgreesWithCpu) {
  const std::vector<std::array<int64_t, 3>> shapes = {{384, 128, 1}, {384, 128, 0}, {128, 128, 1},
                                                      {384, 128, 1}, {33, 70, 0},   {70, 33, 1}};
  std::vector<std::vector<float>> a, out;
  std::vector<float*> gout;
  std::vector<GramTask> tasks, cpu_tasks;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const auto [rows, cols, outer] = shapes[i];
    const int64_t k = outer ? rows : cols;
    a.push_back(random_vector(rows * cols, 110 + i));
    out.emplace_back(k * k);
    gout.push_back(dev().alloc<float>(k * k));
    tasks.push_back({dev().upload(a[i]), gout[i], rows, cols, outer != 0});
    cpu_tasks.push_back({a[i].data(), out[i].data(), rows, cols, outer != 0});
  }
  gpu().gram_many(tasks);
  cpu().gram_many(cpu_tasks);
  for (size_t i = 0; i < shapes.size(); ++i) {
    const int64_t k = shapes[i][2] ? shapes[i][0] : shapes[i][1];
    const auto g = dev().download(gout[i], k * k);
    EXPECT_CLOSE(g, out[i], 1e-4) << "task " << i;
    for (int64_t r = 0; r < k; ++r)
      for (int64_t c = 0; c < r; ++c)
        ASSERT_EQ(g[r * k + c], g[c * k + r]) << "symmetry, task " << i;
  }
}

}  // namespace
}  // namespace core
