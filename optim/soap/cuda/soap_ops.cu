// The SOAP family's ops on the CUDA backend: soap_math.h, the same functions the CPU ops run; the
// clip's sum of squares uses a fixed reduction tree (deterministic, equal to the CPU's index order
// up to float64 rounding). nvcc contracts a * b + c into fused multiply-adds, so elementwise
// results may differ from the CPU's in the last float bit.
#include <cuda_runtime.h>

#include <string>

#include "core/check.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_launch.cuh"
#include "optim/soap/eigenbasis.h"
#include "optim/soap/soap_ops.h"

namespace optim {

namespace {

using core::cuda_detail::block_allreduce;
using core::cuda_detail::DeviceBuffer;
using core::cuda_detail::first_index;
using core::cuda_detail::grid_for;
using core::cuda_detail::grid_stride;
using core::cuda_detail::kThreads;
using core::cuda_detail::Sum;

constexpr int kReduceThreads = 1024;  // one block reduces a whole update

__global__ void adam_kernel(float* d, float* m, float* v, const float* g, int64_t n,
                            kmath::SoapAdamStep step) {
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    if (step.raw) {
      d[i] = kmath::soap_adam_raw(m[i], v[i], g[i], step);
    } else {
      // g^2 rounded on its own (as the reference stores it), not fused into the lerp.
      d[i] = kmath::soap_adam_corrected(m[i], v[i], g[i], __fmul_rn(g[i], g[i]), step);
    }
  }
}

// out[0] = sum of x^2 in float64, one block of kReduceThreads.
__global__ void sum_squares_block_kernel(double* out, const float* x, int64_t n) {
  Sum<double> s;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const double xi = x[i];
    s.value += xi * xi;
  }
  s = block_allreduce(s);
  if (threadIdx.x == 0) out[0] = s.value;
}

__global__ void clip_rms_kernel(float* d, int64_t n, const double* sum_squares, double max_rms) {
  const float s = kmath::soap_rms_clip_scale(*sum_squares, n, max_rms);
  for (int64_t i = first_index(); i < n; i += grid_stride())
    d[i] *= s;
}

__global__ void kl_root_weight_columns_kernel(float* out, const float* q, const float* lam,
                                              int64_t n, double eps) {
  for (int64_t k = first_index(); k < n * n; k += grid_stride())
    out[k] = q[k] * kmath::kl_inverse_root_weight(lam[k % n], eps, n);
}

class CudaSoapOps final : public SoapOps {
 public:
  explicit CudaSoapOps(core::CudaBackend& backend) : backend_(backend) {}

  void adam(float* d, float* m, float* v, const float* g, int64_t n,
            const kmath::SoapAdamStep& step) override {
    if (n <= 0) return;
    adam_kernel<<<grid_for(n), kThreads, 0, backend_.stream()>>>(d, m, v, g, n, step);
    ENGINE_CUDA_LAUNCHED();
  }

  void clip_update_rms(float* d, int64_t n, double max_rms) override {
    if (n <= 0) return;
    DeviceBuffer<double> sum(backend_.allocator(), 1);
    sum_squares_block_kernel<<<1, kReduceThreads, 0, backend_.stream()>>>(sum.get(), d, n);
    ENGINE_CUDA_LAUNCHED();
    clip_rms_kernel<<<grid_for(n), kThreads, 0, backend_.stream()>>>(d, n, sum.get(), max_rms);
    ENGINE_CUDA_LAUNCHED();
  }

  void kl_root_weight_columns(float* out, const float* q, const float* lam, int64_t n,
                              double eps) override {
    if (n <= 0) return;
    kl_root_weight_columns_kernel<<<grid_for(n * n), kThreads, 0, backend_.stream()>>>(out, q, lam,
                                                                                       n, eps);
    ENGINE_CUDA_LAUNCHED();
  }

  // Batched: each step of the refresh is one call for every factor (eigh_many and qr_many run
  // cuSOLVER's batched solvers). One at a time: a factor's whole refresh after another's.
  void refresh(std::span<const FactorRefresh> jobs, int power_iter_steps, bool batched,
               SoapPhaseTimes* times) override {
    if (batched) {
      refresh_factors_batched(backend_, jobs, power_iter_steps, times);
      return;
    }
    for (const FactorRefresh& j : jobs)
      refresh_factor(backend_, j, power_iter_steps, times);
  }

 private:
  core::CudaBackend& backend_;
};

}  // namespace

std::unique_ptr<SoapOps> make_cuda_soap_ops(core::Backend& backend) {
  auto* cuda = dynamic_cast<core::CudaBackend*>(&backend);
  ENGINE_CHECK(cuda != nullptr,
               std::string("the CUDA SOAP ops need a CUDA backend, got ") + backend.name());
  return std::make_unique<CudaSoapOps>(*cuda);
}

}  // namespace optim
