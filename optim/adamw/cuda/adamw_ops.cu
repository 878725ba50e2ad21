// AdamW's op on the CUDA backend: one launch for all the tensors of a step (a table of them,
// uploaded with the stream, one block per chunk of a tensor), adamw_math.h's float form per
// element (kmath::adamw_element_f32; the CPU keeps the float64 one), the gradient scale read on
// the device.
#include <cuda_runtime.h>

#include <climits>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_launch.cuh"
#include "optim/adamw/adamw_ops.h"

namespace optim {

namespace {

using core::cuda_detail::DeviceBuffer;
using core::cuda_detail::kThreads;
using core::cuda_detail::owner_of_block;

// Elements per block: a block updates one chunk of one tensor.
constexpr int64_t kChunk = int64_t{1} << 16;

// A tensor of the launch (its step's scalars in float), with the index of its first chunk
// among all the tensors' chunks.
struct ChunkedTensor {
  float* w;
  float* m;
  float* v;
  const float* g;
  const float* g_scale;
  int64_t n;
  kmath::AdamWStepF32 step;
  int64_t first_chunk;
};

// Block b updates chunk b of all the tensors' chunks (the table is in chunk order).
__global__ void adamw_many_kernel(const ChunkedTensor* table, int count) {
  const int64_t b = blockIdx.x;
  const int k = owner_of_block(b, count, [table](int i) { return table[i].first_chunk; });
  const ChunkedTensor t = table[k];
  const float scale = t.g_scale ? *t.g_scale : 1.0f;
  const int64_t begin = (b - t.first_chunk) * kChunk;
  const int64_t end = begin + kChunk < t.n ? begin + kChunk : t.n;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    kmath::adamw_element_f32(t.w[i], t.m[i], t.v[i], t.g[i] * scale, t.step);
}

class CudaAdamWOps final : public AdamWOps {
 public:
  explicit CudaAdamWOps(core::CudaBackend& backend) : backend_(backend) {}

  void update(std::span<const AdamWTensor> tensors) override {
    std::vector<ChunkedTensor> table;
    int64_t chunks = 0;
    for (const AdamWTensor& t : tensors) {
      if (t.n <= 0) continue;
      table.push_back({t.w, t.m, t.v, t.g, t.g_scale, t.n, kmath::adamw_step_f32(t.step), chunks});
      chunks += (t.n + kChunk - 1) / kChunk;
    }
    if (table.empty()) return;
    ENGINE_CHECK(chunks <= INT_MAX, std::string(backend_.name()) + ": adamw: " +
                                        std::to_string(chunks) + " chunks exceed one launch");
    // The table travels with the stream (an asynchronous upload), so the host does not wait.
    DeviceBuffer<ChunkedTensor> device_table(backend_.allocator(),
                                             static_cast<int64_t>(table.size()));
    backend_.copy_from_host(device_table.get(), table.data(), table.size() * sizeof(ChunkedTensor));
    adamw_many_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, backend_.stream()>>>(
        device_table.get(), static_cast<int>(table.size()));
    ENGINE_CUDA_LAUNCHED();
  }

 private:
  core::CudaBackend& backend_;
};

}  // namespace

std::unique_ptr<AdamWOps> make_cuda_adamw_ops(core::Backend& backend) {
  auto* cuda = dynamic_cast<core::CudaBackend*>(&backend);
  ENGINE_CHECK(cuda != nullptr,
               std::string("the CUDA AdamW ops need a CUDA backend, got ") + backend.name());
  return std::make_unique<CudaAdamWOps>(*cuda);
}

}  // namespace optim
