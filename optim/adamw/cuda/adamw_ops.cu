// AdamW's op on the CUDA backend: adamw_math.h per element (float64 arithmetic on float storage),
// as on the CPU; nvcc's fused multiply-adds may move the last bit.
#include <cuda_runtime.h>

#include <string>

#include "core/check.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_launch.cuh"
#include "optim/adamw/adamw_ops.h"

namespace optim {

namespace {

using core::cuda_detail::first_index;
using core::cuda_detail::grid_for;
using core::cuda_detail::grid_stride;
using core::cuda_detail::kThreads;

__global__ void adamw_update_kernel(float* w, float* m, float* v, const float* g, int64_t n,
                                    kmath::AdamWStep step) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    kmath::adamw_element(w[i], m[i], v[i], g[i], step);
}

class CudaAdamWOps final : public AdamWOps {
 public:
  explicit CudaAdamWOps(core::CudaBackend& backend) : stream_(backend.stream()) {}

  void update(float* w, float* m, float* v, const float* g, int64_t n,
              const kmath::AdamWStep& step) override {
    if (n <= 0) return;
    adamw_update_kernel<<<grid_for(n), kThreads, 0, stream_>>>(w, m, v, g, n, step);
    ENGINE_CUDA_LAUNCHED();
  }

 private:
  CUstream_st* stream_;
};

}  // namespace

std::unique_ptr<AdamWOps> make_cuda_adamw_ops(core::Backend& backend) {
  auto* cuda = dynamic_cast<core::CudaBackend*>(&backend);
  ENGINE_CHECK(cuda != nullptr,
               std::string("the CUDA AdamW ops need a CUDA backend, got ") + backend.name());
  return std::make_unique<CudaAdamWOps>(*cuda);
}

}  // namespace optim
