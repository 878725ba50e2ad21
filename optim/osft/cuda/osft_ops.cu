// OSFT's ops on the CUDA backend: one thread per output element evaluating the float64 element
// formulas of osft_math.h (kmath::osft_*), which the CPU tests check against the CPU ops. Products
// over a reduced index are plain float64 loops in index order; the S_low gradient sums its rows in
// a fixed block order, so every result is deterministic.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/check.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_launch.cuh"
#include "optim/osft/osft_math.h"
#include "optim/osft/osft_ops.h"

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

__global__ void osft_reconstruct_kernel(float* w, const float* u_high, const float* s_high,
                                        const float* v_high, const float* u_low, const float* s_low,
                                        const float* v_low, int64_t n, int64_t m, int64_t k,
                                        int64_t r) {
  for (int64_t e = first_index(); e < n * m; e += grid_stride())
    w[e] = kmath::osft_dense_element(u_high, s_high, v_high, u_low, s_low, v_low, m, k, r, e / m,
                                     e % m);
}

__global__ void osft_grad_u_kernel(float* du, const float* dw, const float* s_low,
                                   const float* v_low, int64_t n, int64_t m, int64_t r) {
  for (int64_t e = first_index(); e < n * r; e += grid_stride())
    du[e] += kmath::osft_grad_u_element(dw, v_low, s_low, m, e / r, e % r);
}

// One block per j: the rows' terms of dS_low[j], reduced in a fixed order.
__global__ void osft_grad_s_kernel(float* ds, const float* dw, const float* u_low,
                                   const float* v_low, int64_t n, int64_t m, int64_t r) {
  const int64_t j = blockIdx.x;
  Sum<double> s;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    s.value += kmath::osft_grad_s_term(dw, u_low, v_low, m, r, i, j);
  s = block_allreduce(s);
  if (threadIdx.x == 0) ds[j] += static_cast<float>(s.value);
}

__global__ void osft_grad_v_kernel(float* dv, const float* dw, const float* u_low,
                                   const float* s_low, int64_t n, int64_t m, int64_t r) {
  for (int64_t e = first_index(); e < r * m; e += grid_stride())
    dv[e] += kmath::osft_grad_v_element(dw, u_low, s_low, n, m, r, e / m, e % m);
}

__global__ void osft_left_coefficients_kernel(double* coeff, const float* u_high, const float* x,
                                              int64_t n, int64_t k, int64_t r) {
  for (int64_t e = first_index(); e < k * r; e += grid_stride())
    coeff[e] = kmath::osft_left_coefficient(u_high, x, n, k, r, e / r, e % r);
}

__global__ void osft_project_left_kernel(float* x, const float* u_high, const double* coeff,
                                         int64_t n, int64_t k, int64_t r) {
  for (int64_t e = first_index(); e < n * r; e += grid_stride())
    x[e] = kmath::osft_project_left_element(x[e], u_high, coeff, k, r, e / r, e % r);
}

// t [rows, k]: the right coefficients of every row of x [rows, m].
__global__ void osft_right_coefficients_kernel(double* t, const float* x, const float* v_high,
                                               int64_t rows, int64_t k, int64_t m) {
  for (int64_t e = first_index(); e < rows * k; e += grid_stride())
    t[e] = kmath::osft_right_coefficient(x + (e / k) * m, v_high, m, e % k);
}

__global__ void osft_project_right_kernel(float* x, const double* t, const float* v_high,
                                          int64_t rows, int64_t k, int64_t m) {
  for (int64_t e = first_index(); e < rows * m; e += grid_stride())
    x[e] = kmath::osft_project_right_element(x[e], t + (e / m) * k, v_high, k, m, e % m);
}

__global__ void osft_sum_partials_kernel(double* total, const double* partial, int64_t parts,
                                         int64_t count) {
  for (int64_t i = first_index(); i < count; i += grid_stride())
    total[i] = kmath::osft_sum_partials_element(partial, parts, count, i);
}

class CudaOsftOps final : public OsftOps {
 public:
  explicit CudaOsftOps(core::CudaBackend& backend) : backend_(backend), stream_(backend.stream()) {}

  void reconstruct(float* w, const float* u_high, const float* s_high, const float* v_high,
                   const float* u_low, const float* s_low, const float* v_low, int64_t n, int64_t m,
                   int64_t k, int64_t r) override {
    if (n * m == 0) return;
    osft_reconstruct_kernel<<<grid_for(n * m), kThreads, 0, stream_>>>(
        w, u_high, s_high, v_high, u_low, s_low, v_low, n, m, k, r);
    ENGINE_CUDA_LAUNCHED();
  }

  void factor_grads(float* du, float* ds, float* dv, const float* dw, const float* u_low,
                    const float* s_low, const float* v_low, int64_t n, int64_t m,
                    int64_t r) override {
    if (r == 0) return;
    if (n > 0) {
      osft_grad_u_kernel<<<grid_for(n * r), kThreads, 0, stream_>>>(du, dw, s_low, v_low, n, m, r);
      ENGINE_CUDA_LAUNCHED();
    }
    osft_grad_s_kernel<<<grid_rows(r, "osft_factor_grads"), kThreads, 0, stream_>>>(ds, dw, u_low,
                                                                                    v_low, n, m, r);
    ENGINE_CUDA_LAUNCHED();
    if (m > 0) {
      osft_grad_v_kernel<<<grid_for(r * m), kThreads, 0, stream_>>>(dv, dw, u_low, s_low, n, m, r);
      ENGINE_CUDA_LAUNCHED();
    }
  }

  void left_coefficients(double* coeff, const float* u_high, const float* x, int64_t n, int64_t k,
                         int64_t r) override {
    if (k * r == 0) return;
    osft_left_coefficients_kernel<<<grid_for(k * r), kThreads, 0, stream_>>>(coeff, u_high, x, n, k,
                                                                             r);
    ENGINE_CUDA_LAUNCHED();
  }

  void project_left(float* x, const float* u_high, const double* coeff, int64_t n, int64_t k,
                    int64_t r) override {
    if (n * r == 0) return;
    osft_project_left_kernel<<<grid_for(n * r), kThreads, 0, stream_>>>(x, u_high, coeff, n, k, r);
    ENGINE_CUDA_LAUNCHED();
  }

  void project_right(float* x, const float* v_high, int64_t rows, int64_t k, int64_t m) override {
    if (rows * m == 0 || k == 0) return;  // no frozen rows: x stays as it is
    // All coefficients first, then the update (x is overwritten in place).
    DeviceBuffer<double> t(backend_.allocator(), rows * k);
    osft_right_coefficients_kernel<<<grid_for(rows * k), kThreads, 0, stream_>>>(t.get(), x, v_high,
                                                                                 rows, k, m);
    ENGINE_CUDA_LAUNCHED();
    osft_project_right_kernel<<<grid_for(rows * m), kThreads, 0, stream_>>>(x, t.get(), v_high,
                                                                            rows, k, m);
    ENGINE_CUDA_LAUNCHED();
  }

  void sum_partials(double* total, const double* partial, int64_t parts, int64_t count) override {
    if (count == 0) return;
    osft_sum_partials_kernel<<<grid_for(count), kThreads, 0, stream_>>>(total, partial, parts,
                                                                        count);
    ENGINE_CUDA_LAUNCHED();
  }

 private:
  core::CudaBackend& backend_;
  CUstream_st* stream_;
};

}  // namespace

std::unique_ptr<OsftOps> make_cuda_osft_ops(core::Backend& backend) {
  auto* cuda = dynamic_cast<core::CudaBackend*>(&backend);
  ENGINE_CHECK(cuda != nullptr,
               std::string("the CUDA OSFT ops need a CUDA backend, got ") + backend.name());
  return std::make_unique<CudaOsftOps>(*cuda);
}

}  // namespace optim
