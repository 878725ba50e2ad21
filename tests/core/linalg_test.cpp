// Linear algebra of the CPU backend by its defining identities, on random, ill-conditioned
// (condition number 1e6), repeated-eigenvalue and rank-deficient inputs (the QR of qr_many,
// CholeskyQR2 or Householder, against LAPACK's too); Newton-Schulz by its
// singular-value band, its orientation symmetry and the golden reference outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "core/backend.h"
#include "core/cpu/cpu_linalg.h"
#include "grad_check.h"

namespace {

using core::test::expect_within;
using core::test::random_vec;
using DVec = std::vector<double>;
using FVec = std::vector<float>;
namespace cpu = core::cpu;

core::Backend& be() {
  return core::cpu_backend();
}

// C [m, n] = A [m, k] B [k, n] in float64, either operand optionally transposed (as stored).
DVec matmul(const DVec& a, const DVec& b, int64_t m, int64_t n, int64_t k, bool ta = false,
            bool tb = false) {
  DVec c(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t l = 0; l < k; ++l) {
      double x = ta ? a[l * m + i] : a[i * k + l];
      for (int64_t j = 0; j < n; ++j)
        c[i * n + j] += x * (tb ? b[j * k + l] : b[l * n + j]);
    }
  }
  return c;
}

double frob(const DVec& a) {
  double s = 0.0;
  for (double x : a)
    s += x * x;
  return std::sqrt(s);
}

double frob_diff(const DVec& a, const DVec& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i)
    s += (a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(s);
}

FVec to_f(const DVec& v) {
  return FVec(v.begin(), v.end());
}

// ||Q^T Q - I||_F for q [m, r].
double orthonormality_error(const DVec& q, int64_t m, int64_t r) {
  DVec g = matmul(q, q, r, r, m, true, false);
  for (int64_t i = 0; i < r; ++i)
    g[i * r + i] -= 1.0;
  return frob(g);
}

// A random orthonormal [n, n] matrix (the Q of a Gaussian matrix, float64 LAPACK).
DVec random_orthogonal(int64_t n, uint64_t seed) {
  DVec g = random_vec(n * n, seed), q(n * n), r(n * n);
  cpu::qr(q.data(), r.data(), g.data(), n, n, 1);
  return q;
}

// U diag(s) V^T with random orthonormal U [m, m] and V [n, n] (first r = len(s) columns).
DVec with_singular_values(int64_t m, int64_t n, const DVec& s, uint64_t seed) {
  DVec u = random_orthogonal(m, seed), v = random_orthogonal(n, seed + 1), a(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double x = 0.0;
      for (size_t l = 0; l < s.size(); ++l)
        x += u[i * m + l] * s[l] * v[j * n + l];
      a[i * n + j] = x;
    }
  }
  return a;
}

DVec logspace(double hi, double lo, int64_t n) {
  DVec s(n);
  for (int64_t i = 0; i < n; ++i)
    s[i] = hi * std::pow(lo / hi, static_cast<double>(i) / (n - 1));
  return s;
}

// Float results against identities in float64, normalised so one bound fits every size:
// orthonormality ||Q^T Q - I||_F / sqrt(r), reconstruction ||QR - A||_F / ||A||_F, and the
// spectrum max_j |w_j - w*_j| / ||A||_F. Each check prints its number; measured over all cases:
constexpr double kOrthonormalTol = 4e-6;     // measured 1.7e-7 .. 6.6e-7 (SVD V)
constexpr double kReconstructionTol = 4e-6;  // measured 1.3e-7 .. 8.1e-7 (eigh, cond 1e6)
constexpr double kSpectrumTol = 1e-6;        // measured 1.2e-7 .. 1.8e-7

// ---- QR -----------------------------------------------------------------------------------------

void check_qr(const DVec& a, int64_t m, int64_t n, int64_t batch, const std::string& what) {
  int64_t r = std::min(m, n);
  FVec af = to_f(a), q(batch * m * r), rr(batch * r * n);
  be().qr(q.data(), rr.data(), af.data(), m, n, batch);
  for (int64_t p = 0; p < batch; ++p) {
    DVec qp(q.begin() + p * m * r, q.begin() + (p + 1) * m * r);
    DVec rp(rr.begin() + p * r * n, rr.begin() + (p + 1) * r * n);
    DVec ap(af.begin() + p * m * n, af.begin() + (p + 1) * m * n);
    expect_within(what + ": ||Q^T Q - I|| / sqrt(r)", orthonormality_error(qp, m, r) / std::sqrt(r),
                  kOrthonormalTol);
    expect_within(what + ": ||QR - A|| / ||A||", frob_diff(matmul(qp, rp, m, n, r), ap) / frob(ap),
                  kReconstructionTol);
    for (int64_t i = 0; i < r; ++i) {
      for (int64_t j = 0; j < std::min(i, n); ++j)
        ASSERT_EQ(rp[i * n + j], 0.0) << what;
    }
  }
}

TEST(CpuLinalg, QrRandomTallWideSquareBatched) {
  check_qr(random_vec(50 * 30, 1), 50, 30, 1, "tall");
  check_qr(random_vec(30 * 50, 2), 30, 50, 1, "wide");
  check_qr(random_vec(40 * 40, 3), 40, 40, 1, "square");
  check_qr(random_vec(5 * 20 * 12, 4), 20, 12, 5, "batch");
}

TEST(CpuLinalg, QrIllConditionedAndRankDeficient) {
  check_qr(with_singular_values(40, 40, logspace(1.0, 1e-6, 40), 5), 40, 40, 1, "cond 1e6");
  check_qr(with_singular_values(30, 20, logspace(1.0, 0.1, 5), 6), 30, 20, 1, "rank 5");
}

// LAPACK's Householder convention (torch.linalg.qr): [3, 4]^T gives Q = -[0.6, 0.8], R = -5.
TEST(CpuLinalg, QrFollowsHouseholderSignConvention) {
  FVec a = {3.0f, 4.0f}, q(2), r(1);
  be().qr(q.data(), r.data(), a.data(), 2, 1, 1);
  EXPECT_FLOAT_EQ(q[0], -0.6f);
  EXPECT_FLOAT_EQ(q[1], -0.8f);
  EXPECT_FLOAT_EQ(r[0], -5.0f);
  // And the float result equals the float64 one column for column (no sign flips).
  DVec g = random_vec(24 * 16, 7), qd(24 * 16), rd(16 * 16);
  cpu::qr(qd.data(), rd.data(), g.data(), 24, 16, 1);
  FVec gf = to_f(g), qf(24 * 16), rf(16 * 16);
  be().qr(qf.data(), rf.data(), gf.data(), 24, 16, 1);
  // measured 2.0e-7
  core::test::expect_within("qr float vs float64, norm-relative", core::test::norm_rel_diff(qf, qd),
                            1e-6);
}

// ---- the orthonormal factor (qr_many): CholeskyQR2, Householder where ill-conditioned ---------

// Q of a [m, n] by orthonormal_factor_one (float), checked by the QR bars with R = Q^T A: Q
// orthonormal, Q R = A, R's diagonal non-negative; and against LAPACK's Householder Q (float64)
// column for column up to sign, norm-relative within `vs_householder` (0: not compared, a
// rank-deficient a has no unique Q).
void check_orthonormal_factor(const DVec& a, int64_t m, int64_t n, const std::string& what,
                              double vs_householder) {
  const int64_t r = std::min(m, n);
  const FVec af = to_f(a);
  FVec qf(static_cast<size_t>(m * r));
  cpu::orthonormal_factor_one(qf.data(), af.data(), m, n, what);
  const DVec q(qf.begin(), qf.end()), ad(af.begin(), af.end());
  const DVec rr = matmul(q, ad, r, n, m, true, false);  // R = Q^T A
  expect_within(what + ": ||Q^T Q - I|| / sqrt(r)", orthonormality_error(q, m, r) / std::sqrt(r),
                kOrthonormalTol);
  expect_within(what + ": ||Q Q^T A - A|| / ||A||",
                frob_diff(matmul(q, rr, m, n, r), ad) / frob(ad), kReconstructionTol);
  for (int64_t i = 0; i < r; ++i)
    EXPECT_GE(rr[i * n + i], -1e-6 * frob(ad)) << what << ": R's diagonal, column " << i;
  if (vs_householder == 0) return;
  DVec qh(static_cast<size_t>(m * r)), rh(static_cast<size_t>(r * n));
  cpu::qr(qh.data(), rh.data(), ad.data(), m, n, 1);
  for (int64_t j = 0; j < r; ++j)
    if (rh[j * n + j] < 0)
      for (int64_t i = 0; i < m; ++i)
        qh[i * r + j] = -qh[i * r + j];
  expect_within(what + ": Q against Householder's (float64, signs matched), norm-relative",
                core::test::norm_rel_diff(qf, qh), vs_householder);
}

// A tall a where CholeskyQR2 applies: it is taken (cholesky_qr2 succeeds) and gives Householder's
// Q to rounding.
void check_cholesky_qr2_taken(const DVec& a, int64_t m, int64_t n, const std::string& what,
                              double vs_householder) {
  const FVec af = to_f(a);
  FVec q(static_cast<size_t>(m * n));
  EXPECT_TRUE(cpu::cholesky_qr2(q.data(), af.data(), m, n)) << what << ": CholeskyQR2 refused";
  check_orthonormal_factor(a, m, n, what, vs_householder);
}

// Against Householder, measured 1.2e-7 .. 5.5e-7 (cond 1e2).
TEST(CpuLinalg, CholeskyQr2WhereConditionedEqualsHouseholderUpToSigns) {
  check_cholesky_qr2_taken(random_vec(60 * 40, 51), 60, 40, "random tall", 2e-6);
  check_cholesky_qr2_taken(with_singular_values(48, 48, logspace(1.0, 1e-2, 48), 52), 48, 48,
                           "cond 1e2", 5e-6);
  // Columns scaled over six orders of magnitude: cond(A) ~ 1e6, but the Cholesky factorisation
  // only sees the condition of the unit-length columns, so the fast path still holds.
  DVec scaled = random_vec(48 * 32, 53);
  for (int64_t i = 0; i < 48; ++i)
    for (int64_t j = 0; j < 32; ++j)
      scaled[i * 32 + j] *= std::pow(10.0, -6.0 * static_cast<double>(j) / 31);
  check_cholesky_qr2_taken(scaled, 48, 32, "columns scaled 1 .. 1e-6", 2e-6);
  // Repeated singular values: Q is still unique (A has full rank).
  DVec rep(40, 1.0);
  std::fill(rep.begin() + 20, rep.end(), 0.5);
  check_cholesky_qr2_taken(with_singular_values(40, 40, rep, 54), 40, 40, "repeated", 2e-6);
}

TEST(CpuLinalg, CholeskyQr2RefusesIllConditionedAndHouseholderTakesOver) {
  const DVec ill = with_singular_values(40, 40, logspace(1.0, 1e-6, 40), 55);
  const DVec rank5 = with_singular_values(30, 20, logspace(1.0, 0.1, 5), 56);
  for (const auto& [a, m, n, what] :
       {std::tuple{ill, 40, 40, "cond 1e6"}, std::tuple{rank5, 30, 20, "rank 5"}}) {
    const FVec af = to_f(a);
    FVec q(static_cast<size_t>(m * n));
    EXPECT_FALSE(cpu::cholesky_qr2(q.data(), af.data(), m, n)) << what;
    check_orthonormal_factor(a, m, n, std::string(what) + ", Householder", 0);
  }
  check_orthonormal_factor(random_vec(24 * 40, 57), 24, 40, "wide, Householder", 4e-6);
}

// ---- eigh ---------------------------------------------------------------------------------------

void check_eigh(const DVec& a, int64_t n, int64_t batch, const std::string& what,
                const DVec& expect_w = {}) {
  FVec af = to_f(a), w(batch * n), v(batch * n * n);
  be().eigh(w.data(), v.data(), af.data(), n, batch);
  for (int64_t p = 0; p < batch; ++p) {
    DVec ap(af.begin() + p * n * n, af.begin() + (p + 1) * n * n);
    DVec vp(v.begin() + p * n * n, v.begin() + (p + 1) * n * n);
    DVec wp(w.begin() + p * n, w.begin() + (p + 1) * n);
    EXPECT_TRUE(std::is_sorted(wp.begin(), wp.end())) << what << " ascending";
    expect_within(what + ": ||V^T V - I|| / sqrt(n)", orthonormality_error(vp, n, n) / std::sqrt(n),
                  kOrthonormalTol);
    DVec vw = vp;  // V diag(w): column j scaled by w_j
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j)
        vw[i * n + j] *= wp[j];
    }
    expect_within(what + ": ||A V - V diag(w)|| / ||A||",
                  frob_diff(matmul(ap, vp, n, n, n), vw) / frob(ap), kReconstructionTol);
    if (!expect_w.empty())
      expect_within(what + ": eigenvalues, max |w - w*| / ||A||",
                    core::compare(wp, expect_w).max_abs() / frob(ap), kSpectrumTol);
  }
}

// Q diag(w) Q^T for a random orthogonal Q.
DVec with_eigenvalues(const DVec& w, uint64_t seed) {
  int64_t n = static_cast<int64_t>(w.size());
  DVec q = random_orthogonal(n, seed), a(n * n, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t l = 0; l < n; ++l)
        a[i * n + j] += q[i * n + l] * w[l] * q[j * n + l];
    }
  }
  for (int64_t i = 0; i < n; ++i) {  // exactly symmetric
    for (int64_t j = 0; j < i; ++j)
      a[j * n + i] = a[i * n + j];
  }
  return a;
}

TEST(CpuLinalg, EighRandomAndBatched) {
  const int64_t n = 40;
  DVec g = random_vec(n * n, 11), a(n * n);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j)
      a[i * n + j] = g[i * n + j] + g[j * n + i];
  }
  check_eigh(a, n, 1, "random");
  DVec batch;
  for (int p = 0; p < 4; ++p) {
    DVec w = random_vec(12, 12 + p);
    DVec ap = with_eigenvalues(w, 20 + p);
    batch.insert(batch.end(), ap.begin(), ap.end());
  }
  check_eigh(batch, 12, 4, "batch");
}

TEST(CpuLinalg, EighIllConditionedAndRepeated) {
  DVec w = logspace(1.0, 1e-6, 32);
  std::sort(w.begin(), w.end());
  check_eigh(with_eigenvalues(w, 30), 32, 1, "cond 1e6", w);
  DVec rep = {-1.0, -1.0, 0.5, 0.5, 0.5, 2.0, 2.0, 2.0, 2.0, 3.0, 0.0, 0.0, 0.0, 0.0};
  std::sort(rep.begin(), rep.end());
  check_eigh(with_eigenvalues(rep, 31), static_cast<int64_t>(rep.size()), 1, "repeated", rep);
}

// GPT-2 124M's MLP width: LAPACKE_ssyevd's own workspace query, a float, rounded 1 + 6n + 2n^2 =
// 18892801 down to 18892800 past 2^24, and LAPACK refused that as an illegal argument (SOAP and
// bench_optim died at their first eigh of a 3072-wide factor). A diagonal matrix: the eigenvalues
// are its entries, the eigenvectors unit vectors.
TEST(CpuLinalg, EighPastTheFloatWorkspaceLimit) {
  const int64_t n = 3072;
  FVec a(n * n, 0.0f), w(n), v(n * n);
  for (int64_t i = 0; i < n; ++i)
    a[i * n + i] = static_cast<float>((i * 1237) % n) + 1.0f;  // 1..n, shuffled
  be().eigh(w.data(), v.data(), a.data(), n, 1);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(w[i], static_cast<float>(i + 1)) << "eigenvalue " << i;
  for (int64_t j = 0; j < n; j += 97) {  // the column of eigenvalue j + 1 is a unit vector
    const int64_t row = [&] {
      for (int64_t i = 0; i < n; ++i)
        if (a[i * n + i] == w[j]) return i;
      return int64_t{-1};
    }();
    EXPECT_EQ(std::fabs(v[row * n + j]), 1.0f) << "eigenvector " << j;
  }
}

TEST(CpuLinalg, WorkspaceSizeRoundsAFloatQueryUpAndKeepsTheMinimum) {
  const int64_t n = 3072, minimum = 1 + 6 * n + 2 * n * n;
  EXPECT_LT(static_cast<int64_t>(static_cast<float>(minimum)), minimum);  // the rounding itself
  EXPECT_GE(core::cpu::workspace_size(static_cast<float>(minimum), 0), minimum);
  EXPECT_EQ(core::cpu::workspace_size(10.0f, minimum), minimum);
  EXPECT_EQ(core::cpu::workspace_size(100.0, 10), 100);
}

// ---- SVD ----------------------------------------------------------------------------------------

void check_svd(const DVec& a, int64_t m, int64_t n, int64_t batch, const std::string& what,
               const DVec& expect_s = {}) {
  int64_t r = std::min(m, n);
  FVec af = to_f(a), u(batch * m * r), s(batch * r), vt(batch * r * n);
  be().svd(u.data(), s.data(), vt.data(), af.data(), m, n, batch);
  for (int64_t p = 0; p < batch; ++p) {
    DVec ap(af.begin() + p * m * n, af.begin() + (p + 1) * m * n);
    DVec up(u.begin() + p * m * r, u.begin() + (p + 1) * m * r);
    DVec sp(s.begin() + p * r, s.begin() + (p + 1) * r);
    DVec vtp(vt.begin() + p * r * n, vt.begin() + (p + 1) * r * n);
    EXPECT_TRUE(std::is_sorted(sp.rbegin(), sp.rend())) << what << " descending";
    EXPECT_GE(*std::min_element(sp.begin(), sp.end()), 0.0) << what;
    expect_within(what + ": ||U^T U - I|| / sqrt(r)", orthonormality_error(up, m, r) / std::sqrt(r),
                  kOrthonormalTol);
    DVec vv(n * r);  // V = Vt^T
    for (int64_t i = 0; i < r; ++i) {
      for (int64_t j = 0; j < n; ++j)
        vv[j * r + i] = vtp[i * n + j];
    }
    expect_within(what + ": ||V^T V - I|| / sqrt(r)", orthonormality_error(vv, n, r) / std::sqrt(r),
                  kOrthonormalTol);
    DVec us = up;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < r; ++j)
        us[i * r + j] *= sp[j];
    }
    expect_within(what + ": ||U diag(s) V^T - A|| / ||A||",
                  frob_diff(matmul(us, vtp, m, n, r), ap) / frob(ap), kReconstructionTol);
    if (!expect_s.empty())
      expect_within(what + ": singular values, max |s - s*| / ||A||",
                    core::compare(sp, expect_s).max_abs() / frob(ap), kSpectrumTol);
  }
}

TEST(CpuLinalg, SvdRandomTallWideBatched) {
  check_svd(random_vec(50 * 30, 41), 50, 30, 1, "tall");
  check_svd(random_vec(30 * 50, 42), 30, 50, 1, "wide");
  check_svd(random_vec(6 * 16 * 10, 43), 16, 10, 6, "batch");
}

TEST(CpuLinalg, SvdIllConditionedAndRankDeficient) {
  DVec s = logspace(1.0, 1e-6, 24);
  check_svd(with_singular_values(36, 24, s, 44), 36, 24, 1, "cond 1e6", s);
  DVec s5 = logspace(3.0, 0.5, 5);
  DVec expect = s5;
  expect.resize(20, 0.0);
  check_svd(with_singular_values(30, 20, s5, 45), 30, 20, 1, "rank 5", expect);
}

TEST(CpuLinalg, RejectsNonFiniteInput) {
  FVec a(9, 1.0f), w(3), v(9);
  a[4] = NAN;
  try {
    be().eigh(w.data(), v.data(), a.data(), 3, 1);
    FAIL() << "no error";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("non-finite value at element 4"), std::string::npos)
        << e.what();
  }
}

}  // namespace
