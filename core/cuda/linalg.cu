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
#include <string>

#include "core/check.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_launch.cuh"
#include "core/kernel_math.h"

namespace core {

using cuda_detail::DeviceBuffer;
using cuda_detail::first_index;
using cuda_detail::grid_for;
using cuda_detail::grid_stride;
using cuda_detail::kThreads;
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

class SyevjParams {
 public:
  SyevjParams() { ENGINE_CUDA_CALL(cusolverDnCreateSyevjInfo(&info_)); }
  ~SyevjParams() { cusolverDnDestroySyevjInfo(info_); }
  SyevjParams(const SyevjParams&) = delete;
  SyevjParams& operator=(const SyevjParams&) = delete;
  syevjInfo_t get() const { return info_; }

 private:
  syevjInfo_t info_ = nullptr;
};

class GesvdjParams {
 public:
  GesvdjParams() { ENGINE_CUDA_CALL(cusolverDnCreateGesvdjInfo(&info_)); }
  ~GesvdjParams() { cusolverDnDestroyGesvdjInfo(info_); }
  GesvdjParams(const GesvdjParams&) = delete;
  GesvdjParams& operator=(const GesvdjParams&) = delete;
  gesvdjInfo_t get() const { return info_; }

 private:
  gesvdjInfo_t info_ = nullptr;
};

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

// One single-matrix call per task in stream order: each result is then bit for bit the one of
// eigh()/qr() on that task alone (syevjBatched would round differently from syevd).
void CudaBackend::eigh_many(std::span<const EighTask> tasks) {
  for (const EighTask& t : tasks)
    eigh(t.w, t.v, t.a, t.n, 1);
}

void CudaBackend::qr_many(std::span<const QrTask> tasks) {
  int64_t r_size = 0;
  for (const QrTask& t : tasks)
    r_size = std::max(r_size, std::min(t.m, t.n) * t.n);
  DeviceBuffer<float> r(allocator_, std::max<int64_t>(r_size, 1));
  for (const QrTask& t : tasks)
    qr(t.q, r.get(), t.a, t.m, t.n, 1);
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
