// The CUDA backend's timing family (core/ops/timing.h): events recorded on the backend's stream.
#include <cuda_runtime.h>

#include <memory>

#include "core/check.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_check.h"

namespace core {

TimeMark CudaBackend::mark() {
  cudaEvent_t event = nullptr;
  ENGINE_CUDA_CALL(cudaEventCreate(&event));
  TimeMark m;
  m.event = std::shared_ptr<void>(event, [](void* e) { cudaEventDestroy(cudaEvent_t(e)); });
  ENGINE_CUDA_CALL(cudaEventRecord(event, stream_));
  return m;
}

double CudaBackend::elapsed_ms(const TimeMark& from, const TimeMark& to) {
  ENGINE_CHECK(from.event != nullptr && to.event != nullptr,
               name_ + ": elapsed_ms: a mark that this backend did not make");
  ENGINE_CUDA_CALL(cudaEventSynchronize(cudaEvent_t(to.event.get())));
  float ms = 0;
  ENGINE_CUDA_CALL(
      cudaEventElapsedTime(&ms, cudaEvent_t(from.event.get()), cudaEvent_t(to.event.get())));
  return ms;
}

}  // namespace core
