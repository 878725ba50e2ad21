// Dense linear algebra for the matrix optimizers on the host, templated on the scalar type:
// thin QR, symmetric eigendecomposition and thin SVD through LAPACKE.
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
#include <span>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/check.h"
#include "core/cpu/cpu_gemm.h"

namespace core::cpu {

// ---- LAPACKE by scalar type -------------------------------------------------------------------

inline lapack_int lapack_geqrf(lapack_int m, lapack_int n, float* a, lapack_int lda, float* tau) {
  return LAPACKE_sgeqrf(LAPACK_ROW_MAJOR, m, n, a, lda, tau);
}
inline lapack_int lapack_geqrf(lapack_int m, lapack_int n, double* a, lapack_int lda, double* tau) {
  return LAPACKE_dgeqrf(LAPACK_ROW_MAJOR, m, n, a, lda, tau);
}
inline lapack_int lapack_orgqr(lapack_int m, lapack_int n, lapack_int k, float* a, lapack_int lda,
                               const float* tau) {
  return LAPACKE_sorgqr(LAPACK_ROW_MAJOR, m, n, k, a, lda, tau);
}
inline lapack_int lapack_orgqr(lapack_int m, lapack_int n, lapack_int k, double* a, lapack_int lda,
                               const double* tau) {
  return LAPACKE_dorgqr(LAPACK_ROW_MAJOR, m, n, k, a, lda, tau);
}
inline lapack_int lapack_syevd(lapack_int n, float* a, float* w) {
  return LAPACKE_ssyevd(LAPACK_ROW_MAJOR, 'V', 'L', n, a, n, w);
}
inline lapack_int lapack_syevd(lapack_int n, double* a, double* w) {
  return LAPACKE_dsyevd(LAPACK_ROW_MAJOR, 'V', 'L', n, a, n, w);
}
inline lapack_int lapack_gesdd(lapack_int m, lapack_int n, float* a, float* s, float* u,
                               float* vt) {
  lapack_int r = std::min(m, n);
  return LAPACKE_sgesdd(LAPACK_ROW_MAJOR, 'S', m, n, a, n, s, u, r, vt, n);
}
inline lapack_int lapack_gesdd(lapack_int m, lapack_int n, double* a, double* s, double* u,
                               double* vt) {
  lapack_int r = std::min(m, n);
  return LAPACKE_dgesdd(LAPACK_ROW_MAJOR, 'S', m, n, a, n, s, u, r, vt, n);
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
  std::vector<T> work(a, a + m * n), tau(static_cast<size_t>(r));
  lapack_int info = lapack_geqrf(m, n, work.data(), n, tau.data());
  ENGINE_CHECK(info == 0, what + ": geqrf failed, info " + std::to_string(info));
  if (r_out) {
    for (int64_t row = 0; row < r; ++row) {
      for (int64_t col = 0; col < n; ++col)
        r_out[row * n + col] = col >= row ? work[row * n + col] : 0;
    }
  }
  info = lapack_orgqr(m, r, r, work.data(), n, tau.data());
  ENGINE_CHECK(info == 0, what + ": orgqr failed, info " + std::to_string(info));
  for (int64_t row = 0; row < m; ++row) {
    std::copy_n(work.data() + row * n, r, q + row * r);
  }
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

// Symmetric eigendecomposition (syevd, lower triangle): w ascending, eigenvectors in columns.
template <typename T>
void eigh_one(T* w, T* v, const T* a, int64_t n, const std::string& what) {
  if (n == 0) return;
  check_finite(a, n * n, what);
  std::copy_n(a, n * n, v);
  lapack_int info = lapack_syevd(n, v, w);
  ENGINE_CHECK(info == 0, what + ": syevd did not converge, info " + std::to_string(info));
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
        qr_one<float>(t.q, nullptr, t.a, t.m, t.n,
                      matrix_name("qr", static_cast<int64_t>(i), t.m, t.n));
      });
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
