// Dense linear algebra for the matrix optimizers on the host, templated on the scalar type:
// thin QR, symmetric eigendecomposition and thin SVD through LAPACKE, and the orthonormal factor
// of a tall matrix by CholeskyQR2 (BLAS-3 only) with Householder as its fallback.
//
// LAPACK rather than Eigen: the reference optimizers call torch.linalg.{qr,eigh,svd}, which run
// LAPACK's geqrf+orgqr, syevd and gesdd, so the same routines give the same Householder sign
// convention and eigenvector choice; OpenBLAS's LAPACK is also multithreaded and blocked.
#pragma once

#include <lapacke.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <exception>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/check.h"
#include "core/cpu/cpu_gemm.h"

namespace core::cpu {

// ---- LAPACKE by scalar type -------------------------------------------------------------------

// Column-major, as LAPACK itself: qr_one transposes once in and once out, where the row-major
// LAPACKE calls would transpose around each of geqrf and orgqr (measured 2 ms of 11 at n 512).
inline lapack_int lapack_geqrf(lapack_int m, lapack_int n, float* a, lapack_int lda, float* tau) {
  return LAPACKE_sgeqrf(LAPACK_COL_MAJOR, m, n, a, lda, tau);
}
inline lapack_int lapack_geqrf(lapack_int m, lapack_int n, double* a, lapack_int lda, double* tau) {
  return LAPACKE_dgeqrf(LAPACK_COL_MAJOR, m, n, a, lda, tau);
}
inline lapack_int lapack_orgqr(lapack_int m, lapack_int n, lapack_int k, float* a, lapack_int lda,
                               const float* tau) {
  return LAPACKE_sorgqr(LAPACK_COL_MAJOR, m, n, k, a, lda, tau);
}
inline lapack_int lapack_orgqr(lapack_int m, lapack_int n, lapack_int k, double* a, lapack_int lda,
                               const double* tau) {
  return LAPACKE_dorgqr(LAPACK_COL_MAJOR, m, n, k, a, lda, tau);
}
// Column-major and upper: on a row-major symmetric buffer that is the row-major lower triangle
// (the one cuSOLVER reads too), with no transposition in or out; the eigenvectors come back as
// rows. Measured 6-12% faster than the row-major LAPACKE call ('L') at n 384-512.
inline lapack_int syevd_work(lapack_int n, float* a, float* w, float* work, lapack_int lwork,
                             lapack_int* iwork, lapack_int liwork) {
  return LAPACKE_ssyevd_work(LAPACK_COL_MAJOR, 'V', 'U', n, a, n, w, work, lwork, iwork, liwork);
}
inline lapack_int syevd_work(lapack_int n, double* a, double* w, double* work, lapack_int lwork,
                             lapack_int* iwork, lapack_int liwork) {
  return LAPACKE_dsyevd_work(LAPACK_COL_MAJOR, 'V', 'U', n, a, n, w, work, lwork, iwork, liwork);
}
// A workspace size LAPACK reports in a float: past 2^24 it is rounded to the nearest float, down
// as often as up, and a size one short is an illegal argument (LAPACKE_ssyevd's own query failed
// so at n 3072, GPT-2 124M's MLP width: "parameter number 8 had an illegal value"). The size is
// within half a unit in the last place above the report; never below the documented minimum.
template <typename T>
lapack_int workspace_size(T reported, int64_t minimum) {
  const double half_ulp =
      (static_cast<double>(std::nextafter(reported, std::numeric_limits<T>::infinity())) -
       static_cast<double>(reported)) /
      2;
  const double up = std::floor(static_cast<double>(reported) + half_ulp);
  return static_cast<lapack_int>(std::max<double>(up, static_cast<double>(minimum)));
}
// syevd with the workspace sized here (LAPACK's minimum for jobz 'V': 1 + 6n + 2n^2 reals and
// 3 + 5n integers).
template <typename T>
lapack_int lapack_syevd(lapack_int n, T* a, T* w) {
  T work_query = 0;
  lapack_int iwork_query = 0;
  lapack_int info = syevd_work(n, a, w, &work_query, -1, &iwork_query, -1);
  if (info != 0) return info;
  const int64_t nn = n;
  std::vector<T> work(static_cast<size_t>(workspace_size(work_query, 1 + 6 * nn + 2 * nn * nn)));
  std::vector<lapack_int> iwork(static_cast<size_t>(std::max<int64_t>(iwork_query, 3 + 5 * nn)));
  return syevd_work(n, a, w, work.data(), static_cast<lapack_int>(work.size()), iwork.data(),
                    static_cast<lapack_int>(iwork.size()));
}
// The lower triangle (column-major) of the Cholesky factor of a symmetric positive definite a:
// on a row-major buffer, the upper triangle R with a = R^T R.
inline lapack_int lapack_potrf(lapack_int n, float* a) {
  return LAPACKE_spotrf(LAPACK_COL_MAJOR, 'L', n, a, n);
}
inline lapack_int lapack_potrf(lapack_int n, double* a) {
  return LAPACKE_dpotrf(LAPACK_COL_MAJOR, 'L', n, a, n);
}
inline lapack_int gesdd_work(lapack_int m, lapack_int n, float* a, float* s, float* u, float* vt,
                             float* work, lapack_int lwork, lapack_int* iwork) {
  const lapack_int r = std::min(m, n);
  return LAPACKE_sgesdd_work(LAPACK_ROW_MAJOR, 'S', m, n, a, n, s, u, r, vt, n, work, lwork, iwork);
}
inline lapack_int gesdd_work(lapack_int m, lapack_int n, double* a, double* s, double* u,
                             double* vt, double* work, lapack_int lwork, lapack_int* iwork) {
  const lapack_int r = std::min(m, n);
  return LAPACKE_dgesdd_work(LAPACK_ROW_MAJOR, 'S', m, n, a, n, s, u, r, vt, n, work, lwork, iwork);
}
// Thin SVD (jobz 'S') with the workspace sized here, as syevd: LAPACK's minimum is
// 3 r^2 + max(max(m, n), 4 r^2 + 4 r) reals and 8 r integers, r = min(m, n).
template <typename T>
lapack_int lapack_gesdd(lapack_int m, lapack_int n, T* a, T* s, T* u, T* vt) {
  T work_query = 0;
  const int64_t r = std::min(m, n), big = std::max(m, n);
  std::vector<lapack_int> iwork(static_cast<size_t>(std::max<int64_t>(1, 8 * r)));
  lapack_int info = gesdd_work(m, n, a, s, u, vt, &work_query, -1, iwork.data());
  if (info != 0) return info;
  std::vector<T> work(static_cast<size_t>(
      workspace_size(work_query, 3 * r * r + std::max(big, 4 * r * r + 4 * r))));
  return gesdd_work(m, n, a, s, u, vt, work.data(), static_cast<lapack_int>(work.size()),
                    iwork.data());
}
inline lapack_int lapack_gesvd(lapack_int m, lapack_int n, float* a, float* s, float* u, float* vt,
                               float* superb) {
  lapack_int r = std::min(m, n);
  return LAPACKE_sgesvd(LAPACK_ROW_MAJOR, 'S', 'S', m, n, a, n, s, u, r, vt, n, superb);
}
inline lapack_int lapack_gesvd(lapack_int m, lapack_int n, double* a, double* s, double* u,
                               double* vt, double* superb) {
  lapack_int r = std::min(m, n);
  return LAPACKE_dgesvd(LAPACK_ROW_MAJOR, 'S', 'S', m, n, a, n, s, u, r, vt, n, superb);
}

// ---- batch driver -----------------------------------------------------------------------------

// Runs fn(i) for every member of a batch: across threads (one single-threaded LAPACK/BLAS call
// each) when the batch is large enough, else one after another with threaded BLAS. An error in
// any member is rethrown after the loop, naming that member.
template <typename Fn>
void for_each_matrix(int64_t batch, Fn fn) {
  if (batch > 1 && batch >= omp_get_max_threads()) {
    std::vector<std::string> errors(static_cast<size_t>(batch));
#pragma omp parallel for schedule(dynamic)
    for (int64_t i = 0; i < batch; ++i) {
      try {
        fn(i);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    }
    for (const std::string& e : errors) {
      if (!e.empty()) throw Error(e);
    }
  } else {
    for (int64_t i = 0; i < batch; ++i)
      fn(i);
  }
}

template <typename T>
void check_finite(const T* a, int64_t count, const std::string& what) {
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(a[i])) {
      ENGINE_FAIL(what + ": input has a non-finite value at element " + std::to_string(i));
    }
  }
}

inline std::string matrix_name(const char* op, int64_t i, int64_t m, int64_t n) {
  return std::string(op) + " of batch member " + std::to_string(i) + " [" + std::to_string(m) +
         ", " + std::to_string(n) + "]";
}

// ---- QR ---------------------------------------------------------------------------------------

// Thin QR of one a [m, n] into q [m, r] and (when r_out is not null) r [r, n], r = min(m, n):
// geqrf then orgqr, as LAPACK (and torch.linalg.qr) does, so diagonal signs follow the
// Householder convention.
template <typename T>
void qr_one(T* q, T* r_out, const T* a, int64_t m, int64_t n, const std::string& what) {
  const int64_t r = std::min(m, n);
  if (r == 0) return;
  check_finite(a, m * n, what);
  // f: a column-major (leading dimension m), the layout LAPACK works in.
  std::vector<T> f(static_cast<size_t>(m * n)), tau(static_cast<size_t>(r));
  for (int64_t row = 0; row < m; ++row)
    for (int64_t col = 0; col < n; ++col)
      f[col * m + row] = a[row * n + col];
  lapack_int info = lapack_geqrf(m, n, f.data(), m, tau.data());
  ENGINE_CHECK(info == 0, what + ": geqrf failed, info " + std::to_string(info));
  if (r_out) {
    for (int64_t row = 0; row < r; ++row) {
      for (int64_t col = 0; col < n; ++col)
        r_out[row * n + col] = col >= row ? f[col * m + row] : 0;
    }
  }
  info = lapack_orgqr(m, r, r, f.data(), m, tau.data());
  ENGINE_CHECK(info == 0, what + ": orgqr failed, info " + std::to_string(info));
  for (int64_t row = 0; row < m; ++row)
    for (int64_t col = 0; col < r; ++col)
      q[row * r + col] = f[col * m + row];
}

// ---- the orthonormal factor: CholeskyQR2, Householder where ill-conditioned ---------------------

// The upper triangle of c [k, k] = a^T a (outer: a a^T) for row-major a with leading dimension
// lda: [inner, k] (outer: [k, inner]).
inline void blas_syrk(bool outer, int64_t k, int64_t inner, const float* a, int64_t lda, float* c) {
  cblas_ssyrk(CblasRowMajor, CblasUpper, outer ? CblasNoTrans : CblasTrans, static_cast<blasint>(k),
              static_cast<blasint>(inner), 1.0f, a, static_cast<blasint>(lda), 0.0f, c,
              static_cast<blasint>(k));
}
inline void blas_syrk(bool outer, int64_t k, int64_t inner, const double* a, int64_t lda,
                      double* c) {
  cblas_dsyrk(CblasRowMajor, CblasUpper, outer ? CblasNoTrans : CblasTrans, static_cast<blasint>(k),
              static_cast<blasint>(inner), 1.0, a, static_cast<blasint>(lda), 0.0, c,
              static_cast<blasint>(k));
}
// g [n, n] (upper) = a^T a for a [m, n].
template <typename T>
void blas_syrk_gram(int64_t m, int64_t n, const T* a, T* g) {
  blas_syrk(false, n, m, a, n, g);
}
inline void blas_solve_right_upper(int64_t m, int64_t n, const float* r, float* b) {
  cblas_strsm(CblasRowMajor, CblasRight, CblasUpper, CblasNoTrans, CblasNonUnit,
              static_cast<blasint>(m), static_cast<blasint>(n), 1.0f, r, static_cast<blasint>(n), b,
              static_cast<blasint>(n));
}
inline void blas_solve_right_upper(int64_t m, int64_t n, const double* r, double* b) {
  cblas_dtrsm(CblasRowMajor, CblasRight, CblasUpper, CblasNoTrans, CblasNonUnit,
              static_cast<blasint>(m), static_cast<blasint>(n), 1.0, r, static_cast<blasint>(n), b,
              static_cast<blasint>(n));
}

// Q1 <- Q1 R^{-1} for the Cholesky factor R of the Gram matrix g = Q1^T Q1 (upper, row-major,
// in place in g). False when the factorisation fails or a pivot proves the columns nearly
// dependent (g's diagonal holds the squared column lengths on entry).
template <typename T>
bool cholesky_qr_pass(T* q1, T* g, int64_t m, int64_t n) {
  std::vector<T> length2(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j)
    length2[j] = g[j * n + j];
  if (lapack_potrf(static_cast<lapack_int>(n), g) != 0) return false;
  for (int64_t j = 0; j < n; ++j) {
    const double pivot = static_cast<double>(g[j * n + j]);
    if (!(pivot * kCholQrMaxScaledCondition >= std::sqrt(static_cast<double>(length2[j]))))
      return false;
  }
  blas_solve_right_upper(m, n, g, q1);
  return true;
}

// The Q factor q [m, n] of a tall a [m, n] (m >= n) with R's diagonal positive: two passes of
// Cholesky QR (G = Q^T Q, G = R^T R, Q <- Q R^{-1}; syrk, potrf and trsm, so BLAS-3 throughout).
// False when a is too ill-conditioned for it (kCholQrMaxDeviation, kCholQrMaxScaledCondition);
// q is then unspecified. Within those limits Q is orthonormal to rounding and equals the
// Householder Q up to rounding and column signs.
template <typename T>
bool cholesky_qr2(T* q, const T* a, int64_t m, int64_t n) {
  std::copy_n(a, m * n, q);
  std::vector<T> g(static_cast<size_t>(n * n));
  blas_syrk_gram(m, n, q, g.data());
  if (!cholesky_qr_pass(q, g.data(), m, n)) return false;
  blas_syrk_gram(m, n, q, g.data());
  double deviation2 = 0;  // ||Q1^T Q1 - I||_F^2 from the upper triangle
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i; j < n; ++j) {
      const double e = static_cast<double>(g[i * n + j]) - (i == j ? 1.0 : 0.0);
      deviation2 += (i == j ? 1.0 : 2.0) * e * e;
    }
  if (!(deviation2 <= kCholQrMaxDeviation * kCholQrMaxDeviation)) return false;
  return cholesky_qr_pass(q, g.data(), m, n);
}

// The Q factor q [m, r] of a [m, n], r = min(m, n), with the diagonal of R non-negative, so
// that it does not depend on the method: CholeskyQR2 for a tall or square a that is not too
// ill-conditioned, else Householder (qr_one) with its columns' signs set to make R's diagonal
// non-negative. Differs from qr_one's Q only by rounding and column signs (for full rank a).
template <typename T>
void orthonormal_factor_one(T* q, const T* a, int64_t m, int64_t n, const std::string& what) {
  const int64_t r = std::min(m, n);
  if (r == 0) return;
  check_finite(a, m * n, what);
  if (m >= n && cholesky_qr2(q, a, m, n)) return;
  std::vector<T> rr(static_cast<size_t>(r * n));
  qr_one(q, rr.data(), a, m, n, what);
  for (int64_t j = 0; j < r; ++j)
    if (rr[j * n + j] < 0)
      for (int64_t i = 0; i < m; ++i)
        q[i * r + j] = -q[i * r + j];
}

template <typename T>
void qr(T* q, T* r_out, const T* a, int64_t m, int64_t n, int64_t batch) {
  const int64_t r = std::min(m, n);
  if (r == 0) return;
  for_each_matrix(batch, [&](int64_t i) {
    qr_one(q + i * m * r, r_out + i * r * n, a + i * m * n, m, n, matrix_name("qr", i, m, n));
  });
}

// ---- eigh -------------------------------------------------------------------------------------

// Symmetric eigendecomposition (syevd of the row-major lower triangle): w ascending,
// eigenvectors in columns.
template <typename T>
void eigh_one(T* w, T* v, const T* a, int64_t n, const std::string& what) {
  if (n == 0) return;
  check_finite(a, n * n, what);
  std::copy_n(a, n * n, v);
  lapack_int info = lapack_syevd(n, v, w);
  ENGINE_CHECK(info == 0, what + ": syevd did not converge, info " + std::to_string(info));
  // Column-major vectors read row-major are V^T: transpose in place.
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < i; ++j)
      std::swap(v[i * n + j], v[j * n + i]);
}

template <typename T>
void eigh(T* w, T* v, const T* a, int64_t n, int64_t batch) {
  if (n == 0) return;
  for_each_matrix(batch, [&](int64_t i) {
    eigh_one(w + i * n, v + i * n * n, a + i * n * n, n, matrix_name("eigh", i, n, n));
  });
}

// ---- many solves of different sizes -----------------------------------------------------------

// Runs fn(task, index) for every task inside one parallel region, largest first, so every
// LAPACK call is single-threaded (OpenBLAS does not thread inside a parallel region): a task's
// result then depends neither on the other tasks nor on the thread count, which threaded LAPACK
// on one matrix does not guarantee (it rounds differently). Errors are rethrown after the loop.
template <typename Task, typename Size, typename Fn>
void for_each_task(std::span<const Task> tasks, Size size, Fn fn) {
  const int64_t count = static_cast<int64_t>(tasks.size());
  std::vector<size_t> order(tasks.size());
  for (size_t i = 0; i < order.size(); ++i)
    order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t x, size_t y) { return size(tasks[x]) > size(tasks[y]); });
  std::vector<std::string> errors(tasks.size());
#pragma omp parallel for schedule(dynamic)
  for (int64_t i = 0; i < count; ++i) {
    const size_t t = order[static_cast<size_t>(i)];
    try {
      fn(tasks[t], t);
    } catch (const std::exception& e) {
      errors[t] = e.what();
    }
  }
  for (const std::string& e : errors)
    if (!e.empty()) throw Error(e);
}

inline void eigh_many(std::span<const EighTask> tasks) {
  for_each_task(
      tasks, [](const EighTask& t) { return t.n; },
      [](const EighTask& t, size_t i) {
        eigh_one(t.w, t.v, t.a, t.n, matrix_name("eigh", static_cast<int64_t>(i), t.n, t.n));
      });
}

inline void qr_many(std::span<const QrTask> tasks) {
  for_each_task(
      tasks, [](const QrTask& t) { return t.m * t.n; },
      [](const QrTask& t, size_t i) {
        const std::string what = matrix_name("qr", static_cast<int64_t>(i), t.m, t.n);
        if (!t.left) {
          orthonormal_factor_one<float>(t.q, t.a, t.m, t.n, what);
          return;
        }
        std::vector<float> product(static_cast<size_t>(t.m * t.n));
        blas_gemm(false, false, t.m, t.n, t.m, 1.0f, t.left, t.m, t.a, t.n, 0.0f, product.data(),
                  t.n);
        orthonormal_factor_one<float>(t.q, product.data(), t.m, t.n, what);
      });
}

// out [k, k] = a^T a (outer: a a^T) for a [rows, cols], k = cols (outer: rows): syrk into the
// upper triangle, mirrored to the lower one.
template <typename T>
void gram_one(T* out, const T* a, int64_t rows, int64_t cols, bool outer) {
  const int64_t k = outer ? rows : cols, inner = outer ? cols : rows;
  if (k == 0) return;
  if (inner == 0) {
    std::fill_n(out, k * k, T(0));
    return;
  }
  blas_syrk(outer, k, inner, a, cols, out);
  for (int64_t i = 0; i < k; ++i)
    for (int64_t j = 0; j < i; ++j)
      out[i * k + j] = out[j * k + i];
}

inline void gram_many(std::span<const GramTask> tasks) {
  for_each_task(
      tasks, [](const GramTask& t) { return t.rows * t.cols * (t.outer ? t.rows : t.cols); },
      [](const GramTask& t, size_t) { gram_one(t.out, t.a, t.rows, t.cols, t.outer); });
}

// ---- SVD --------------------------------------------------------------------------------------

// Thin SVD (gesdd, the divide-and-conquer driver torch uses; gesvd when it does not converge):
// u [m, r], s [r] descending, vt [r, n].
template <typename T>
void svd(T* u, T* s, T* vt, const T* a, int64_t m, int64_t n, int64_t batch) {
  int64_t r = std::min(m, n);
  if (r == 0) return;
  for_each_matrix(batch, [&](int64_t i) {
    std::string what = matrix_name("svd", i, m, n);
    const T* ai = a + i * m * n;
    check_finite(ai, m * n, what);
    std::vector<T> work(ai, ai + m * n);
    T* ui = u + i * m * r;
    T* si = s + i * r;
    T* vti = vt + i * r * n;
    lapack_int info = lapack_gesdd(m, n, work.data(), si, ui, vti);
    if (info > 0) {
      std::copy(ai, ai + m * n, work.begin());
      std::vector<T> superb(static_cast<size_t>(std::max<int64_t>(1, r - 1)));
      info = lapack_gesvd(m, n, work.data(), si, ui, vti, superb.data());
    }
    ENGINE_CHECK(info == 0, what + ": gesdd and gesvd failed, info " + std::to_string(info));
  });
}

}  // namespace core::cpu
