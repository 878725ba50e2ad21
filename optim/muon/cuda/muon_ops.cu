// Muon's ops on the CUDA backend: Newton-Schulz from the backend's batched GEMM, NorMuon's
// statistics as block reductions (float64, fixed order), muon_math.h per element as on the CPU.
#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "core/check.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_launch.cuh"
#include "optim/muon/muon_ops.h"

namespace optim {

namespace {

using core::cuda_detail::block_allreduce;
using core::cuda_detail::DeviceBuffer;
using core::cuda_detail::first_index;
using core::cuda_detail::grid_for;
using core::cuda_detail::grid_rows;
using core::cuda_detail::grid_stride;
using core::cuda_detail::kThreads;
using core::cuda_detail::Sum;
using core::cuda_detail::Sum2;
using core::cuda_detail::to_int;

// Per matrix of x [batch, size]: x *= 1 / (norm_scale * ||x||_F + norm_eps), one block each.
// The Frobenius norm is accumulated in float64.
__global__ void normalize_frobenius_kernel(float* x, int64_t size, float norm_scale,
                                           float norm_eps) {
  float* mat = x + static_cast<int64_t>(blockIdx.x) * size;
  Sum<double> ss;
  for (int64_t i = threadIdx.x; i < size; i += blockDim.x) {
    double v = mat[i];
    ss.value += v * v;
  }
  ss = block_allreduce(ss);
  float factor = 1.0f / (norm_scale * static_cast<float>(sqrt(ss.value)) + norm_eps);
  for (int64_t i = threadIdx.x; i < size; i += blockDim.x)
    mat[i] *= factor;
}

__global__ void cautious_update_kernel(float* w, const float* u, int64_t n, double lr, double wd) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    w[i] = kmath::cautious_update_element(w[i], u[i], lr, wd);
}

// NorMuon row statistics: q[k * rows + i] = sum of squares of row i of matrix k (one block each).
__global__ void normuon_row_sums_kernel(double* q, const float* u, int64_t cols) {
  const float* x = u + static_cast<int64_t>(blockIdx.x) * cols;
  Sum<double> s;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const double xj = x[j];
    s.value += xj * xj;
  }
  s = block_allreduce(s);
  if (threadIdx.x == 0) q[blockIdx.x] = s.value;
}

// NorMuon column statistics: q[k * cols + j] = sum of squares of column j of matrix k, one thread
// per column walking down the rows (neighbouring threads read neighbouring columns).
__global__ void normuon_col_sums_kernel(double* q, const float* u, int64_t rows, int64_t cols,
                                        int64_t total) {
  for (int64_t t = first_index(); t < total; t += grid_stride()) {
    const int64_t k = t / cols, j = t % cols;
    const float* x = u + k * rows * cols + j;
    double s = 0;
    for (int64_t i = 0; i < rows; ++i) {
      const double xi = x[i * cols];
      s += xi * xi;
    }
    q[t] = s;
  }
}

// One block per matrix: updates the second moments from q, replaces q by the scales and writes
// the matrix's norm-keeping factor to keep[k].
__global__ void normuon_scales_kernel(double* q, double* keep, float* second_moment, int64_t stats,
                                      double entries, double beta2) {
  double* qk = q + static_cast<int64_t>(blockIdx.x) * stats;
  float* sk = second_moment + static_cast<int64_t>(blockIdx.x) * stats;
  Sum2<double> norms;  // a: ||V||^2, b: ||V * scale||^2
  for (int64_t a = threadIdx.x; a < stats; a += blockDim.x) {
    const double qa = qk[a];
    const double sa = kmath::normuon_second_moment(sk[a], qa, entries, beta2);
    sk[a] = static_cast<float>(sa);
    const double scale = kmath::normuon_scale(sa);
    qk[a] = scale;
    norms.a += qa;
    norms.b += qa * scale * scale;
  }
  norms = block_allreduce(norms);
  if (threadIdx.x == 0) keep[blockIdx.x] = kmath::normuon_keep_norm(norms.a, norms.b);
}

__global__ void normuon_apply_kernel(float* u, const double* scale, const double* keep,
                                     int64_t rows, int64_t cols, bool per_row, int64_t total) {
  const int64_t stats = per_row ? rows : cols;
  for (int64_t i = first_index(); i < total; i += grid_stride()) {
    const int64_t k = i / (rows * cols), e = i % (rows * cols);
    const int64_t a = per_row ? e / cols : e % cols;
    u[i] = kmath::normuon_apply(u[i], scale[k * stats + a], keep[k]);
  }
}

class CudaMuonOps final : public MuonOps {
 public:
  explicit CudaMuonOps(core::CudaBackend& backend) : backend_(backend), stream_(backend.stream()) {}

  void newton_schulz(float* x, int64_t m, int64_t n, const NewtonSchulzSchedule& schedule,
                     int64_t batch) override {
    ENGINE_CHECK(m >= 0 && n >= 0 && batch >= 0,
                 std::string(backend_.name()) + ": newton_schulz: negative size");
    if (m == 0 || n == 0 || batch == 0) return;
    // Iterate on the wide orientation X [rows, cols], rows <= cols, so X X^T is the small Gram
    // matrix; a tall input is transposed in and out.
    const bool tall = m > n;
    const int64_t rows = tall ? n : m;
    const int64_t cols = tall ? m : n;
    const int64_t size = m * n;
    core::Allocator& memory = backend_.allocator();
    DeviceBuffer<float> work_a(memory, batch * size);
    DeviceBuffer<float> work_b(memory, batch * size);
    DeviceBuffer<float> gram(memory, batch * rows * rows);
    DeviceBuffer<float> poly(memory, batch * rows * rows);
    float* cur = work_a.get();
    float* next = work_b.get();
    if (tall) {
      core::cuda_detail::transpose_batched(cur, x, batch, m, n, size, stream_);
    } else {
      backend_.copy(cur, x, static_cast<size_t>(batch * size) * sizeof(float));
    }
    normalize_frobenius_kernel<<<to_int(batch, "batch", "newton_schulz"), kThreads, 0, stream_>>>(
        cur, size, schedule.norm_scale, schedule.norm_eps);
    ENGINE_CUDA_LAUNCHED();
    const int64_t gsize = rows * rows;
    for (const auto& [ca, cb, cc] : schedule.coefficients) {
      // gram = X X^T
      backend_.gemm({.trans_b = true,
                     .m = rows,
                     .n = rows,
                     .k = cols,
                     .batch = batch,
                     .stride_a = size,
                     .stride_b = size,
                     .stride_c = gsize},
                    cur, cur, gram.get());
      // poly = b gram + c gram^2
      backend_.copy(poly.get(), gram.get(), static_cast<size_t>(batch * gsize) * sizeof(float));
      backend_.gemm({.m = rows,
                     .n = rows,
                     .k = rows,
                     .alpha = cc,
                     .beta = cb,
                     .batch = batch,
                     .stride_a = gsize,
                     .stride_b = gsize,
                     .stride_c = gsize},
                    gram.get(), gram.get(), poly.get());
      // next = a X + poly X
      backend_.copy(next, cur, static_cast<size_t>(batch * size) * sizeof(float));
      backend_.gemm({.m = rows,
                     .n = cols,
                     .k = rows,
                     .alpha = 1.0f,
                     .beta = ca,
                     .batch = batch,
                     .stride_a = gsize,
                     .stride_b = size,
                     .stride_c = size},
                    poly.get(), cur, next);
      std::swap(cur, next);
    }
    if (tall) {
      core::cuda_detail::transpose_batched(x, cur, batch, n, m, size, stream_);
    } else {
      backend_.copy(x, cur, static_cast<size_t>(batch * size) * sizeof(float));
    }
  }

  void normuon_normalize(float* u, float* second_moment, int64_t count, int64_t rows, int64_t cols,
                         double beta2) override {
    ENGINE_CHECK(count >= 0 && rows >= 0 && cols >= 0,
                 std::string(backend_.name()) + ": normuon_normalize: negative size");
    if (count == 0 || rows == 0 || cols == 0) return;
    const bool per_row = rows >= cols;
    const int64_t stats = per_row ? rows : cols;
    DeviceBuffer<double> q(backend_.allocator(), count * stats);  // sums of squares, then scales
    DeviceBuffer<double> keep(backend_.allocator(), count);
    if (per_row) {
      normuon_row_sums_kernel<<<grid_rows(count * rows, "normuon_normalize"), kThreads, 0,
                                stream_>>>(q.get(), u, cols);
    } else {
      normuon_col_sums_kernel<<<grid_for(count * cols), kThreads, 0, stream_>>>(q.get(), u, rows,
                                                                                cols, count * cols);
    }
    ENGINE_CUDA_LAUNCHED();
    normuon_scales_kernel<<<grid_rows(count, "normuon_normalize"), kThreads, 0, stream_>>>(
        q.get(), keep.get(), second_moment, stats, static_cast<double>(per_row ? cols : rows),
        beta2);
    ENGINE_CUDA_LAUNCHED();
    const int64_t total = count * rows * cols;
    normuon_apply_kernel<<<grid_for(total), kThreads, 0, stream_>>>(u, q.get(), keep.get(), rows,
                                                                    cols, per_row, total);
    ENGINE_CUDA_LAUNCHED();
  }

  void cautious_update(float* w, const float* u, int64_t n, double lr, double wd) override {
    if (n <= 0) return;
    cautious_update_kernel<<<grid_for(n), kThreads, 0, stream_>>>(w, u, n, lr, wd);
    ENGINE_CUDA_LAUNCHED();
  }

 private:
  core::CudaBackend& backend_;
  CUstream_st* stream_;
};

}  // namespace

std::unique_ptr<MuonOps> make_cuda_muon_ops(core::Backend& backend) {
  auto* cuda = dynamic_cast<core::CudaBackend*>(&backend);
  ENGINE_CHECK(cuda != nullptr,
               std::string("the CUDA Muon ops need a CUDA backend, got ") + backend.name());
  return std::make_unique<CudaMuonOps>(*cuda);
}

}  // namespace optim
