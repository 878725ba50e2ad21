// The CUDA backend's linalg family (core/ops/linalg.h): QR, symmetric eigendecomposition and SVD
// through cuSOLVER.
//
// cuSOLVER is column-major; our matrices are row-major. A row-major [m, n] buffer read as
// column-major with leading dimension n is the [n, m] matrix A^T. Each op below states which
// matrix it hands to cuSOLVER and how the outputs map back.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cusolverDn.h>

#include <algorithm>
#include <array>
#include <climits>
#include <span>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_launch.cuh"
#include "core/kernel_math.h"

namespace core {

using cuda_detail::block_allreduce;
using cuda_detail::DeviceBuffer;
using cuda_detail::first_index;
using cuda_detail::grid_for;
using cuda_detail::grid_stride;
using cuda_detail::kThreads;
using cuda_detail::Sum;
using cuda_detail::to_int;
using cuda_detail::transpose_batched;

namespace {

__global__ void transpose_kernel(float* out, const float* in, int64_t rows, int64_t cols,
                                 int64_t in_stride, int64_t total) {
  for (int64_t o = first_index(); o < total; o += grid_stride()) {
    // o indexes out [batch, cols, rows] at (b, j, i); read in[b] [rows, cols] at (i, j).
    const int64_t i = o % rows;
    const int64_t j = (o / rows) % cols;
    const int64_t b = o / (rows * cols);
    out[o] = in[b * in_stride + i * cols + j];
  }
}

__global__ void flag_non_finite_kernel(const float* a, int64_t size, int64_t total, int* status) {
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    if (!isfinite(a[i]))
      cuda_detail::raise_status(status, cuda_detail::kStatusNonFiniteInput, i / size);
  }
}

// Every element finds its place in the stable descending order by counting (O(n^2), n is a
// factor's size).
__global__ void argsort_descending_kernel(int32_t* order, const float* x, int64_t n) {
  for (int64_t j = first_index(); j < n; j += grid_stride())
    order[kmath::descending_rank(x, n, j)] = static_cast<int32_t>(j);
}

__global__ void gather_columns_kernel(float* out, const float* src, const int32_t* index,
                                      int64_t rows, int64_t cols, int* status) {
  for (int64_t k = first_index(); k < rows * cols; k += grid_stride()) {
    const int64_t i = k / cols, j = k % cols;
    const int32_t from = index[j];
    if (from < 0 || from >= cols) {
      cuda_detail::raise_status(status, cuda_detail::kStatusColumnIndexOutOfRange, j);
      out[k] = 0.0f;
      continue;
    }
    out[k] = src[i * cols + from];
  }
}

__global__ void reverse_columns_kernel(float* out, const float* src, int64_t rows, int64_t cols) {
  for (int64_t k = first_index(); k < rows * cols; k += grid_stride()) {
    const int64_t i = k / cols, j = k % cols;
    out[k] = src[i * cols + (cols - 1 - j)];
  }
}

// One thread per column: it finds the column's sign and negates it.
__global__ void canonicalize_column_signs_kernel(float* q, int64_t rows, int64_t cols) {
  for (int64_t j = first_index(); j < cols; j += grid_stride())
    if (kmath::column_sign_flips(q, rows, cols, j))
      for (int64_t i = 0; i < rows; ++i)
        q[i * cols + j] = -q[i * cols + j];
}

// q [m, k] <- q diag(sign(r_jj)) for R r [k, n]: the columns of a Householder Q signed so that R's
// diagonal is non-negative (qr_many's convention).
__global__ void sign_columns_by_r_kernel(float* q, const float* r, int64_t m, int64_t k,
                                         int64_t n) {
  for (int64_t o = first_index(); o < m * k; o += grid_stride()) {
    const int64_t j = o % k;
    if (r[j * n + j] < 0.0f) q[o] = -q[o];
  }
}

// Mirrors the upper triangle of each column-major [k, k] matrix (ld k) to the lower one, so that a
// product computed as a full GEMM is exactly symmetric.
__global__ void mirror_upper_kernel(float* const* c, int64_t k, int64_t count) {
  for (int64_t o = first_index(); o < count * k * k; o += grid_stride()) {
    const int64_t b = o / (k * k), e = o % (k * k);
    const int64_t i = e % k, j = e / k;  // column-major (i, j)
    if (i > j) c[b][i + j * k] = c[b][j + i * k];
  }
}

// d [count, n] = the diagonal of each column-major [n, n] matrix of g (n * n apart).
__global__ void diagonals_kernel(float* d, const float* g, int64_t n, int64_t count) {
  for (int64_t o = first_index(); o < count * n; o += grid_stride()) {
    const int64_t b = o / n, j = o % n;
    d[o] = g[b * n * n + j * (n + 1)];
  }
}

// After a batched Cholesky factorisation of Gram matrices (the upper factor U in g): clears
// ok[b] when member b failed (info) or a pivot proves its columns nearly dependent
// (u_jj * max_condition < sqrt of the Gram's diagonal, saved in length2), as the CPU's
// cholesky_qr_pass. One block per member.
__global__ void cholesky_pivots_kernel(int* ok, const int* info, const float* g,
                                       const float* length2, int64_t n, double max_condition) {
  const int64_t b = blockIdx.x;
  int bad = threadIdx.x == 0 && info[b] != 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const double pivot = g[b * n * n + j * (n + 1)];
    if (!(pivot * max_condition >= sqrt(static_cast<double>(length2[b * n + j])))) bad = 1;
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) ok[b] = 0;
}

// Clears ok[b] when ||G_b - I||_F > max_deviation for the Gram matrix G_b of a first-pass Q
// (cholesky_qr2's test before its second pass). One block per member.
__global__ void orthonormality_kernel(int* ok, const float* g, int64_t n, double max_deviation) {
  const int64_t b = blockIdx.x;
  Sum<double> s;
  for (int64_t e = threadIdx.x; e < n * n; e += blockDim.x) {
    const double x = static_cast<double>(g[b * n * n + e]) - (e % n == e / n ? 1.0 : 0.0);
    s.value += x * x;
  }
  s = block_allreduce(s);
  if (threadIdx.x == 0 && !(s.value <= max_deviation * max_deviation)) ok[b] = 0;
}

// The Jacobi batched solvers (syevjBatched, gesvdjBatched) only take matrices up to 32 x 32.
constexpr int64_t kJacobiBatchedMax = 32;

// r [batch, k, n] = the upper trapezoid of the first k rows of each column-major [m, n] factor
// (ld m, `stride` elements apart) left by geqrf: r[i, j] = f[i + j m] for i <= j, else 0.
__global__ void extract_r_kernel(float* r, const float* f, int64_t m, int64_t n, int64_t k,
                                 int64_t stride, int64_t total) {
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < total;
       o += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t j = o % n;
    const int64_t i = (o / n) % k;
    const int64_t b = o / (n * k);
    r[o] = i <= j ? f[b * stride + i + j * m] : 0.0f;
  }
}

// A cuSOLVER parameter object (syevjInfo_t, gesvdjInfo_t, cusolverDnParams_t) owned for one
// scope: created with its defaults, destroyed at the end.
template <typename Handle, cusolverStatus_t (*Create)(Handle*), cusolverStatus_t (*Destroy)(Handle)>
class SolverObject {
 public:
  SolverObject() { ENGINE_CUDA_CALL(Create(&handle_)); }
  ~SolverObject() { Destroy(handle_); }
  SolverObject(const SolverObject&) = delete;
  SolverObject& operator=(const SolverObject&) = delete;
  Handle get() const { return handle_; }

 private:
  Handle handle_ = nullptr;
};

using SyevjParams =
    SolverObject<syevjInfo_t, cusolverDnCreateSyevjInfo, cusolverDnDestroySyevjInfo>;
using GesvdjParams =
    SolverObject<gesvdjInfo_t, cusolverDnCreateGesvdjInfo, cusolverDnDestroyGesvdjInfo>;
using SolverParams =
    SolverObject<cusolverDnParams_t, cusolverDnCreateParams, cusolverDnDestroyParams>;

}  // namespace

// ---- QR ----------------------------------------------------------------------------------------

void CudaBackend::qr(float* q, float* r, const float* a, int64_t m, int64_t n, int64_t batch) {
  ENGINE_CHECK(m >= 0 && n >= 0 && batch >= 0, name_ + ": qr: negative size");
  if (m == 0 || n == 0 || batch == 0) return;
  const char* op = "qr";
  const int64_t k = std::min(m, n);
  const int64_t size = m * n;
  const int im = to_int(m, "m", op), in = to_int(n, "n", op), ik = to_int(k, "min(m, n)", op);
  // geqrf needs A itself column-major: transpose row-major a [m, n] into f, which read
  // column-major (ld m) is A.
  cuda_detail::flag_non_finite(a, size, batch, status_, stream_);
  DeviceBuffer<float> f(allocator_, batch * size);
  transpose_batched(f.get(), a, batch, m, n, size, stream_);
  DeviceBuffer<float> tau(allocator_, batch * k);
  DeviceBuffer<int> info(allocator_, 2 * batch);  // geqrf, then orgqr
  int lwork_geqrf = 0, lwork_orgqr = 0;
  ENGINE_CUDA_CALL(cusolverDnSgeqrf_bufferSize(cusolver_, im, in, f.get(), im, &lwork_geqrf));
  ENGINE_CUDA_CALL(
      cusolverDnSorgqr_bufferSize(cusolver_, im, ik, ik, f.get(), im, tau.get(), &lwork_orgqr));
  const int lwork = std::max({lwork_geqrf, lwork_orgqr, 1});
  DeviceBuffer<float> work(allocator_, lwork);
  for (int64_t b = 0; b < batch; ++b) {
    ENGINE_CUDA_CALL(cusolverDnSgeqrf(cusolver_, im, in, f.get() + b * size, im, tau.get() + b * k,
                                      work.get(), lwork, info.get() + b));
  }
  // R [k, n] is the upper trapezoid of the factored A; take it before orgqr overwrites f.
  extract_r_kernel<<<grid_for(batch * k * n), kThreads, 0, stream_>>>(r, f.get(), m, n, k, size,
                                                                      batch * k * n);
  ENGINE_CUDA_LAUNCHED();
  // orgqr forms the first k columns of Q in place: column-major [m, k] with ld m, i.e. the
  // row-major [k, m] matrix Q^T; transposing it gives row-major q [m, k].
  for (int64_t b = 0; b < batch; ++b) {
    ENGINE_CUDA_CALL(cusolverDnSorgqr(cusolver_, im, ik, ik, f.get() + b * size, im,
                                      tau.get() + b * k, work.get(), lwork,
                                      info.get() + batch + b));
  }
  transpose_batched(q, f.get(), batch, k, m, size, stream_);
  check_solver_info(info.get(), batch, "qr (geqrf)");
  check_solver_info(info.get() + batch, batch, "qr (orgqr)");
}

// ---- symmetric eigendecomposition --------------------------------------------------------------

void CudaBackend::eigh(float* w, float* v, const float* a, int64_t n, int64_t batch) {
  ENGINE_CHECK(n >= 0 && batch >= 0, name_ + ": eigh: negative size");
  if (n == 0 || batch == 0) return;
  const char* op = "eigh";
  const int in = to_int(n, "n", op);
  const int64_t size = n * n;
  // A symmetric row-major a read column-major is A^T = A. The solvers read one triangle: the
  // column-major upper one is the row-major lower one, the triangle the CPU backend's
  // LAPACKE_ssyevd(row-major, 'L') reads, so both see the same matrix even if a is not exactly
  // symmetric.
  cuda_detail::flag_non_finite(a, size, batch, status_, stream_);
  DeviceBuffer<float> f(allocator_, batch * size);
  copy(f.get(), a, static_cast<size_t>(batch * size) * sizeof(float));
  DeviceBuffer<int> info(allocator_, batch);
  const cusolverEigMode_t jobz = CUSOLVER_EIG_MODE_VECTOR;
  const cublasFillMode_t uplo = CUBLAS_FILL_MODE_UPPER;
  if (batch > 1 && n <= kJacobiBatchedMax) {
    SyevjParams params;  // defaults: tolerance at machine precision, eigenvalues ascending
    const int ibatch = to_int(batch, "batch", op);
    int lwork = 0;
    ENGINE_CUDA_CALL(cusolverDnSsyevjBatched_bufferSize(cusolver_, jobz, uplo, in, f.get(), in, w,
                                                        &lwork, params.get(), ibatch));
    DeviceBuffer<float> work(allocator_, std::max(lwork, 1));
    ENGINE_CUDA_CALL(cusolverDnSsyevjBatched(cusolver_, jobz, uplo, in, f.get(), in, w, work.get(),
                                             lwork, info.get(), params.get(), ibatch));
  } else {
    int lwork = 0;
    ENGINE_CUDA_CALL(
        cusolverDnSsyevd_bufferSize(cusolver_, jobz, uplo, in, f.get(), in, w, &lwork));
    DeviceBuffer<float> work(allocator_, std::max(lwork, 1));
    for (int64_t b = 0; b < batch; ++b) {
      ENGINE_CUDA_CALL(cusolverDnSsyevd(cusolver_, jobz, uplo, in, f.get() + b * size, in,
                                        w + b * n, work.get(), lwork, info.get() + b));
    }
  }
  // The solver leaves eigenvector j as column j of column-major f: f[i + j n] is component i.
  // Read row-major, f is V^T; transposing gives v[i n + j] = component i of vector j.
  transpose_batched(v, f.get(), batch, n, n, size, stream_);
  check_solver_info(info.get(), batch,
                    batch > 1 && n <= kJacobiBatchedMax ? "eigh (syevjBatched)" : "eigh (syevd)");
}

// ---- SVD ---------------------------------------------------------------------------------------

// ---- many solves of different sizes -----------------------------------------------------------

namespace {

// syevBatched takes n * n * batch < 2^31 elements per call; a larger group is split.
constexpr int64_t kSyevBatchedMaxElements = INT_MAX;
constexpr int kBlockThreads = 256;

// A device array of pointers (the batched cuBLAS and cuSOLVER calls take arrays of matrices).
template <typename T>
class DevicePointers {
 public:
  DevicePointers(Allocator& allocator, const std::vector<T*>& host, cudaStream_t stream)
      : buffer_(allocator, std::max<int64_t>(static_cast<int64_t>(host.size()), 1)) {
    ENGINE_CUDA_CALL(cudaMemcpyAsync(buffer_.get(), host.data(), host.size() * sizeof(T*),
                                     cudaMemcpyHostToDevice, stream));
  }
  T** get() const { return buffer_.get(); }

 private:
  DeviceBuffer<T*> buffer_;
};

// Task indices grouped by a key (sizes), in first-seen order of the keys.
template <typename Task, typename Key>
std::vector<std::vector<size_t>> group_by(std::span<const Task> tasks, Key key) {
  std::vector<std::vector<size_t>> groups;
  std::vector<decltype(key(tasks[0]))> keys;
  for (size_t i = 0; i < tasks.size(); ++i) {
    const auto k = key(tasks[i]);
    const auto at = std::find(keys.begin(), keys.end(), k);
    if (at == keys.end()) {
      keys.push_back(k);
      groups.push_back({i});
    } else {
      groups[static_cast<size_t>(at - keys.begin())].push_back(i);
    }
  }
  return groups;
}

}  // namespace

// The tasks of each size as one batched solver call on a packed copy: syevjBatched (Jacobi) up
// to 32, syevBatched (cusolverDnXsyevBatched) above. A task's solver depends only on its size,
// so a list and the same tasks one per call run the same solver.
void CudaBackend::eigh_many(std::span<const EighTask> tasks) {
  const cusolverEigMode_t jobz = CUSOLVER_EIG_MODE_VECTOR;
  const cublasFillMode_t uplo = CUBLAS_FILL_MODE_UPPER;  // the row-major lower triangle
  for (const std::vector<size_t>& all : group_by(tasks, [](const EighTask& t) { return t.n; })) {
    const int64_t n = tasks[all[0]].n;
    if (n == 0) continue;
    const int64_t size = n * n;
    const int64_t per_call = std::max<int64_t>(1, kSyevBatchedMaxElements / size);
    for (size_t first = 0; first < all.size(); first += static_cast<size_t>(per_call)) {
      const std::vector<size_t> members(
          all.begin() + static_cast<int64_t>(first),
          all.begin() + static_cast<int64_t>(std::min(all.size(), first + per_call)));
      const int64_t count = static_cast<int64_t>(members.size());
      DeviceBuffer<float> f(allocator_, count * size), w(allocator_, count * n);
      DeviceBuffer<int> info(allocator_, count);
      std::vector<unsigned char> host_work;  // syevBatched's; kept until the info is read
      for (int64_t b = 0; b < count; ++b)
        copy(f.get() + b * size, tasks[members[b]].a, static_cast<size_t>(size) * sizeof(float));
      cuda_detail::flag_non_finite(f.get(), size, count, status_, stream_);
      const char* op;
      if (n <= kJacobiBatchedMax) {
        op = "eigh_many (syevjBatched)";
        SyevjParams params;
        const int in = to_int(n, "n", op), ibatch = to_int(count, "batch", op);
        int lwork = 0;
        ENGINE_CUDA_CALL(cusolverDnSsyevjBatched_bufferSize(cusolver_, jobz, uplo, in, f.get(), in,
                                                            w.get(), &lwork, params.get(), ibatch));
        DeviceBuffer<float> work(allocator_, std::max(lwork, 1));
        ENGINE_CUDA_CALL(cusolverDnSsyevjBatched(cusolver_, jobz, uplo, in, f.get(), in, w.get(),
                                                 work.get(), lwork, info.get(), params.get(),
                                                 ibatch));
      } else {
        op = "eigh_many (syevBatched)";
        SolverParams params;
        size_t device_bytes = 0, host_bytes = 0;
        ENGINE_CUDA_CALL(cusolverDnXsyevBatched_bufferSize(
            cusolver_, params.get(), jobz, uplo, n, CUDA_R_32F, f.get(), n, CUDA_R_32F, w.get(),
            CUDA_R_32F, &device_bytes, &host_bytes, count));
        DeviceBuffer<unsigned char> device_work(allocator_,
                                                std::max<int64_t>(1, int64_t(device_bytes)));
        host_work.resize(std::max<size_t>(1, host_bytes));
        ENGINE_CUDA_CALL(cusolverDnXsyevBatched(cusolver_, params.get(), jobz, uplo, n, CUDA_R_32F,
                                                f.get(), n, CUDA_R_32F, w.get(), CUDA_R_32F,
                                                device_work.get(), device_bytes, host_work.data(),
                                                host_bytes, info.get(), count));
      }
      // Column-major eigenvectors read row-major are V^T: transposed into each task's v.
      for (int64_t b = 0; b < count; ++b) {
        const EighTask& t = tasks[members[b]];
        copy(t.w, w.get() + b * n, static_cast<size_t>(n) * sizeof(float));
        transpose_batched(t.v, f.get() + b * size, 1, n, n, size, stream_);
      }
      check_solver_info(info.get(), count, op);
    }
  }
}

// Tall and square tasks of each shape as one batched CholeskyQR2 on a packed copy (the products
// with `left` as one batched GEMM, the Gram matrices as batched GEMMs, potrfBatched and
// trsmBatched), each member checked as on the CPU; the members it refuses, and wide tasks, by
// Householder (geqrf, orgqr) with the columns signed so that R's diagonal is non-negative.
void CudaBackend::qr_many(std::span<const QrTask> tasks) {
  const char* op = "qr_many";
  std::vector<size_t> householder;
  const auto shape = [](const QrTask& t) {
    return std::array<int64_t, 3>{t.m, t.n, t.left ? 1 : 0};
  };
  for (const std::vector<size_t>& members : group_by(tasks, shape)) {
    const QrTask& first = tasks[members[0]];
    const int64_t m = first.m, n = first.n, count = static_cast<int64_t>(members.size());
    if (m == 0 || n == 0) continue;
    if (m < n) {
      householder.insert(householder.end(), members.begin(), members.end());
      continue;
    }
    const int im = to_int(m, "m", op), in = to_int(n, "n", op), ibatch = to_int(count, "batch", op);
    const int64_t size = m * n;
    // x: each member's matrix row-major [m, n], i.e. column-major X = Q^T [n, m] (ld n).
    DeviceBuffer<float> x(allocator_, count * size), g(allocator_, count * n * n);
    DeviceBuffer<float> length2(allocator_, count * n);
    DeviceBuffer<int> info(allocator_, count), ok(allocator_, count);
    std::vector<float*> x_ptr, g_ptr;
    std::vector<const float*> a_ptr, left_ptr;
    for (int64_t b = 0; b < count; ++b) {
      const QrTask& t = tasks[members[b]];
      x_ptr.push_back(x.get() + b * size);
      g_ptr.push_back(g.get() + b * n * n);
      a_ptr.push_back(t.a);
      left_ptr.push_back(t.left);
    }
    const DevicePointers<float> xs(allocator_, x_ptr, stream_), gs(allocator_, g_ptr, stream_);
    const float one = 1.0f, zero = 0.0f;
    if (first.left) {
      // X_b = (left_b a_b)^T = a_b^T left_b^T: column-major A^T [n, m] (ld n) times L^T [m, m]
      // (ld m).
      const DevicePointers<const float> as(allocator_, a_ptr, stream_);
      const DevicePointers<const float> lefts(allocator_, left_ptr, stream_);
      ENGINE_CUDA_CALL(cublasSgemmBatched(cublas_, CUBLAS_OP_N, CUBLAS_OP_N, in, im, im, &one,
                                          as.get(), in, lefts.get(), im, &zero, xs.get(), in,
                                          ibatch));
    } else {
      for (int64_t b = 0; b < count; ++b)
        copy(x_ptr[b], a_ptr[b], static_cast<size_t>(size) * sizeof(float));
    }
    cuda_detail::flag_non_finite(x.get(), size, count, status_, stream_);
    ENGINE_CUDA_CALL(cudaMemsetAsync(ok.get(), 0xff, count * sizeof(int), stream_));  // all true
    for (int pass = 0; pass < 2; ++pass) {
      // G_b = X_b X_b^T = Q^T Q (column-major [n, n]).
      ENGINE_CUDA_CALL(cublasSgemmStridedBatched(cublas_, CUBLAS_OP_N, CUBLAS_OP_T, in, in, im,
                                                 &one, x.get(), in, size, x.get(), in, size, &zero,
                                                 g.get(), in, n * n, ibatch));
      if (pass == 1) {
        orthonormality_kernel<<<count, kBlockThreads, 0, stream_>>>(ok.get(), g.get(), n,
                                                                    kCholQrMaxDeviation);
        ENGINE_CUDA_LAUNCHED();
      }
      diagonals_kernel<<<grid_for(count * n), kThreads, 0, stream_>>>(length2.get(), g.get(), n,
                                                                      count);
      ENGINE_CUDA_LAUNCHED();
      // G = U^T U, U upper; Q <- Q U^{-1}, i.e. X <- U^{-T} X.
      ENGINE_CUDA_CALL(cusolverDnSpotrfBatched(cusolver_, CUBLAS_FILL_MODE_UPPER, in, gs.get(), in,
                                               info.get(), ibatch));
      cholesky_pivots_kernel<<<count, kBlockThreads, 0, stream_>>>(
          ok.get(), info.get(), g.get(), length2.get(), n, kCholQrMaxScaledCondition);
      ENGINE_CUDA_LAUNCHED();
      ENGINE_CUDA_CALL(cublasStrsmBatched(cublas_, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_UPPER,
                                          CUBLAS_OP_T, CUBLAS_DIAG_NON_UNIT, in, im, &one, gs.get(),
                                          in, xs.get(), in, ibatch));
    }
    std::vector<int> accepted(static_cast<size_t>(count));
    ENGINE_CUDA_CALL(cudaMemcpyAsync(accepted.data(), ok.get(), count * sizeof(int),
                                     cudaMemcpyDeviceToHost, stream_));
    ENGINE_CUDA_CALL(cudaStreamSynchronize(stream_));
    check_status(op);  // a non-finite input, before anything is written
    for (int64_t b = 0; b < count; ++b) {
      if (accepted[b])
        copy(tasks[members[b]].q, x_ptr[b], static_cast<size_t>(size) * sizeof(float));
      else
        householder.push_back(members[b]);
    }
  }
  // Householder: the product formed first where there is one.
  int64_t r_size = 0, product_size = 0;
  for (const size_t i : householder) {
    r_size = std::max(r_size, std::min(tasks[i].m, tasks[i].n) * tasks[i].n);
    if (tasks[i].left) product_size = std::max(product_size, tasks[i].m * tasks[i].n);
  }
  DeviceBuffer<float> r(allocator_, std::max<int64_t>(r_size, 1));
  DeviceBuffer<float> product(allocator_, std::max<int64_t>(product_size, 1));
  for (const size_t i : householder) {
    const QrTask& t = tasks[i];
    const float* a = t.a;
    if (t.left) {
      GemmArgs args;
      args.m = t.m;
      args.n = t.n;
      args.k = t.m;
      gemm(args, t.left, t.a, product.get());
      a = product.get();
    }
    qr(t.q, r.get(), a, t.m, t.n, 1);
    const int64_t k = std::min(t.m, t.n);
    sign_columns_by_r_kernel<<<grid_for(t.m * k), kThreads, 0, stream_>>>(t.q, r.get(), t.m, k,
                                                                          t.n);
    ENGINE_CUDA_LAUNCHED();
  }
}

// Each shape's Gram matrices as one batched GEMM (a row-major [rows, cols] is the column-major
// X = A^T [cols, rows]: A^T A = X X^T, A A^T = X^T X), mirrored to exact symmetry.
void CudaBackend::gram_many(std::span<const GramTask> tasks) {
  const char* op = "gram_many";
  const auto shape = [](const GramTask& t) {
    return std::array<int64_t, 3>{t.rows, t.cols, t.outer ? 1 : 0};
  };
  for (const std::vector<size_t>& members : group_by(tasks, shape)) {
    const GramTask& first = tasks[members[0]];
    const int64_t k = first.outer ? first.rows : first.cols;
    const int64_t inner = first.outer ? first.cols : first.rows;
    if (k == 0) continue;
    std::vector<float*> out_ptr;
    std::vector<const float*> a_ptr;
    for (const size_t i : members) {
      out_ptr.push_back(tasks[i].out);
      a_ptr.push_back(tasks[i].a);
    }
    const int64_t count = static_cast<int64_t>(members.size());
    const DevicePointers<float> outs(allocator_, out_ptr, stream_);
    const DevicePointers<const float> as(allocator_, a_ptr, stream_);
    const float one = 1.0f, zero = 0.0f;
    const int ik = to_int(k, "size", op), iinner = to_int(inner, "inner size", op);
    const int ld = to_int(first.cols, "cols", op);
    ENGINE_CUDA_CALL(cublasSgemmBatched(cublas_, first.outer ? CUBLAS_OP_T : CUBLAS_OP_N,
                                        first.outer ? CUBLAS_OP_N : CUBLAS_OP_T, ik, ik, iinner,
                                        &one, as.get(), ld, as.get(), ld, &zero, outs.get(), ik,
                                        to_int(count, "batch", op)));
    mirror_upper_kernel<<<grid_for(count * k * k), kThreads, 0, stream_>>>(outs.get(), k, count);
    ENGINE_CUDA_LAUNCHED();
  }
}

void CudaBackend::svd(float* u, float* s, float* vt, const float* a, int64_t m, int64_t n,
                      int64_t batch) {
  ENGINE_CHECK(m >= 0 && n >= 0 && batch >= 0, name_ + ": svd: negative size");
  if (m == 0 || n == 0 || batch == 0) return;
  const char* op = "svd";
  const int64_t r = std::min(m, n);
  const int64_t size = m * n;
  const int im = to_int(m, "m", op), in = to_int(n, "n", op);
  // Hand cuSOLVER B = A^T, the column-major reading of row-major a: [n, m] with ld n, no copy
  // of layout needed (only a copy, since the solver destroys its input). With B = U_B S V_B^T,
  // A = V_B S U_B^T, so u = V_B and vt = U_B^T:
  // - U_B column-major [n, r] (ld n) read row-major is [r, n] = U_B^T = vt: written in place.
  // - V_B column-major [m, r] (ld m) read row-major is [r, m] = V_B^T: transposed into u.
  cuda_detail::flag_non_finite(a, size, batch, status_, stream_);
  DeviceBuffer<float> f(allocator_, batch * size);
  copy(f.get(), a, static_cast<size_t>(batch * size) * sizeof(float));
  DeviceBuffer<int> info(allocator_, batch);
  GesvdjParams params;  // defaults: tolerance at machine precision, values descending
  const cusolverEigMode_t jobz = CUSOLVER_EIG_MODE_VECTOR;
  if (batch > 1 && m <= kJacobiBatchedMax && n <= kJacobiBatchedMax) {
    // The batched form returns full U_B [n, n] and V_B [m, m]; the first r columns are the thin
    // factors.
    const int ibatch = to_int(batch, "batch", op);
    DeviceBuffer<float> ub(allocator_, batch * n * n);
    DeviceBuffer<float> vb(allocator_, batch * m * m);
    int lwork = 0;
    ENGINE_CUDA_CALL(cusolverDnSgesvdjBatched_bufferSize(cusolver_, jobz, in, im, f.get(), in, s,
                                                         ub.get(), in, vb.get(), im, &lwork,
                                                         params.get(), ibatch));
    DeviceBuffer<float> work(allocator_, std::max(lwork, 1));
    ENGINE_CUDA_CALL(cusolverDnSgesvdjBatched(cusolver_, jobz, in, im, f.get(), in, s, ub.get(), in,
                                              vb.get(), im, work.get(), lwork, info.get(),
                                              params.get(), ibatch));
    // vt[b] = the first r n entries of U_B[b] (its first r columns).
    ENGINE_CUDA_CALL(cudaMemcpy2DAsync(vt, r * n * sizeof(float), ub.get(), n * n * sizeof(float),
                                       r * n * sizeof(float), batch, cudaMemcpyDeviceToDevice,
                                       stream_));
    transpose_batched(u, vb.get(), batch, r, m, m * m, stream_);
    check_solver_info(info.get(), batch, "svd (gesvdjBatched)");
    return;
  }
  DeviceBuffer<float> vb(allocator_, batch * m * r);
  const int econ = 1;
  int lwork = 0;
  ENGINE_CUDA_CALL(cusolverDnSgesvdj_bufferSize(cusolver_, jobz, econ, in, im, f.get(), in, s, vt,
                                                in, vb.get(), im, &lwork, params.get()));
  DeviceBuffer<float> work(allocator_, std::max(lwork, 1));
  for (int64_t b = 0; b < batch; ++b) {
    ENGINE_CUDA_CALL(cusolverDnSgesvdj(cusolver_, jobz, econ, in, im, f.get() + b * size, in,
                                       s + b * r, vt + b * r * n, in, vb.get() + b * m * r, im,
                                       work.get(), lwork, info.get() + b, params.get()));
  }
  transpose_batched(u, vb.get(), batch, r, m, m * r, stream_);
  check_solver_info(info.get(), batch, "svd (gesvdj)");
}

void cuda_detail::transpose_batched(float* out, const float* in, int64_t batch, int64_t rows,
                                    int64_t cols, int64_t in_stride, cudaStream_t stream) {
  const int64_t total = batch * rows * cols;
  if (total == 0) return;
  transpose_kernel<<<grid_for(total), kThreads, 0, stream>>>(out, in, rows, cols, in_stride, total);
  ENGINE_CUDA_LAUNCHED();
}

void cuda_detail::flag_non_finite(const float* a, int64_t size, int64_t batch, int* status,
                                  cudaStream_t stream) {
  const int64_t total = size * batch;
  if (total == 0) return;
  flag_non_finite_kernel<<<grid_for(total), kThreads, 0, stream>>>(a, size, total, status);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::argsort_descending(int32_t* order, const float* x, int64_t n) {
  ENGINE_CHECK(n >= 0 && n <= INT32_MAX, name_ + ": argsort_descending: " + std::to_string(n) +
                                             " elements exceed int32 indices");
  if (n == 0) return;
  argsort_descending_kernel<<<grid_for(n), kThreads, 0, stream_>>>(order, x, n);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::gather_columns(float* out, const float* src, const int32_t* index, int64_t rows,
                                 int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  gather_columns_kernel<<<grid_for(rows * cols), kThreads, 0, stream_>>>(out, src, index, rows,
                                                                         cols, status_);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::reverse_columns(float* out, const float* src, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  reverse_columns_kernel<<<grid_for(rows * cols), kThreads, 0, stream_>>>(out, src, rows, cols);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::canonicalize_column_signs(float* q, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  canonicalize_column_signs_kernel<<<grid_for(cols), kThreads, 0, stream_>>>(q, rows, cols);
  ENGINE_CUDA_LAUNCHED();
}

}  // namespace core
