// Op family: Dense linear algebra: thin QR, symmetric eigendecomposition and SVD of one matrix, a
// batch of equal shape, or a list of any shapes solved together; and the column bookkeeping of
// eigenbases. A part of the Backend interface (core/backend.h: the conventions for pointers, shapes
// and accumulation); implemented per device in core/cpu/linalg.cpp and core/cuda/linalg.cu.
#pragma once

#include <cstdint>
#include <span>

namespace core {

// One symmetric eigendecomposition of a list solved together (eigh_many): a [n, n] -> w [n]
// ascending, eigenvectors as the columns of v [n, n], exactly as eigh() lays them out.
struct EighTask {
  const float* a = nullptr;
  float* w = nullptr;
  float* v = nullptr;
  int64_t n = 0;
};

// One thin QR of a list solved together (qr_many): the Q factor q [m, min(m, n)] of a [m, n] (or,
// with `left`, of the product left [m, m] @ a: one step of orthogonal iteration) with the diagonal
// of R non-negative (R is not kept). For a full-rank matrix that Q is unique: it equals qr()'s
// Householder Q up to rounding and the signs of its columns. q may equal a when left is given.
struct QrTask {
  const float* a = nullptr;
  float* q = nullptr;
  int64_t m = 0;
  int64_t n = 0;
  const float* left = nullptr;
};

// When qr_many's CholeskyQR2 path is taken, on every device. A first pass leaves Q1 with
// Q1^T Q1 = I + E, |E| about kappa^2 u (kappa: the condition number of a with its columns scaled
// to unit length; the Cholesky factorisation is insensitive to that scaling). The second pass
// then restores orthonormality to rounding as long as ||E||_2 < 1; it is taken while
// ||E||_F <= kCholQrMaxDeviation (kappa up to about 2e3 in float). Before the first solve, a
// pivot r_jj / ||a_j|| below 1 / kCholQrMaxScaledCondition already proves kappa too large
// (kappa >= ||a_j|| / r_jj). Householder takes over where either limit refuses.
constexpr double kCholQrMaxDeviation = 0.5;
constexpr double kCholQrMaxScaledCondition = 3.0e3;

// One Gram matrix of a list formed together (gram_many): out = a^T a [cols, cols] of a
// [rows, cols], or with `outer` a a^T [rows, rows]; one triangle is computed and mirrored, so out
// is exactly symmetric.
struct GramTask {
  const float* a = nullptr;
  float* out = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  bool outer = false;
};

class LinalgOps {
 public:
  virtual ~LinalgOps() = default;

  // Thin QR of a [m, n]: q [m, r], r [r, n], r = min(m, n); Householder (LAPACK geqrf order).
  virtual void qr(float* q, float* r, const float* a, int64_t m, int64_t n, int64_t batch = 1) = 0;
  // Symmetric eigendecomposition of a [n, n]: eigenvalues w [n] ascending, eigenvectors as the
  // columns of v [n, n] (v[i * n + j] is component i of vector j).
  virtual void eigh(float* w, float* v, const float* a, int64_t n, int64_t batch = 1) = 0;
  // Thin SVD of a [m, n]: u [m, r], s [r] descending, vt [r, n], r = min(m, n).
  virtual void svd(float* u, float* s, float* vt, const float* a, int64_t m, int64_t n,
                   int64_t batch = 1) = 0;
  // Many independent solves of possibly different sizes, as one phase (a batched refresh of
  // many eigenbases). A task's result does not depend on the other tasks of the
  // list, so batching never changes a trajectory: a list gives bit for bit what the same tasks
  // give one per call. CPU: the tasks are spread over the threads, largest first, each solved
  // single-threaded (also for a single task, so the bits do not depend on the thread count
  // either; they may differ from eigh()/qr(), whose one matrix uses threaded LAPACK): syevd, and
  // for a tall or square QR CholeskyQR2 (syrk, potrf, trsm), falling back to Householder when
  // the columns are too close to dependent for it (kCholQrMaxDeviation, kCholQrMaxScaledCondition).
  // CUDA: the tasks of each size (eigh) or shape (qr) as one batched call: syevjBatched up to
  // n 32 and cusolverDnXsyevBatched above; CholeskyQR2 as batched GEMMs, potrfBatched and
  // trsmBatched under the same limits, Householder (geqrf, orgqr, columns signed to the
  // convention) for the members it refuses and for wide tasks.
  virtual void eigh_many(std::span<const EighTask> tasks) = 0;
  virtual void qr_many(std::span<const QrTask> tasks) = 0;
  // The Gram matrices of a list (the Kronecker factors' statistics G G^T, G^T G of many
  // matrices), as one phase like the solves above: CPU, syrk per task spread over the threads,
  // each on one thread; CUDA, one batched product per shape.
  virtual void gram_many(std::span<const GramTask> tasks) = 0;
  // order [n]: the indices that sort x descending, stably, NaN last
  // (kmath::sorts_before_descending); order[j] is the old index of new position j.
  virtual void argsort_descending(int32_t* order, const float* x, int64_t n) = 0;
  // out[i, j] = src[i, index[j]] for [rows, cols] (out must not alias src).
  virtual void gather_columns(float* out, const float* src, const int32_t* index, int64_t rows,
                              int64_t cols) = 0;
  // out[i, j] = src[i, cols - 1 - j] (the solver's ascending eigen order to descending; out must
  // not alias src).
  virtual void reverse_columns(float* out, const float* src, int64_t rows, int64_t cols) = 0;
  // Negates, in place, every column j of q [rows, cols] whose entry of largest magnitude (the
  // lowest row on ties) is negative (kmath::column_sign_flips): one sign for each eigenvector,
  // whichever solver produced it, so a basis recomputed on another device matches.
  virtual void canonicalize_column_signs(float* q, int64_t rows, int64_t cols) = 0;
};

}  // namespace core
