// CUDA backend entry points (the backend itself is being written; see cuda_backend.h).
#include <cuda_runtime.h>

#include "engine/core/backend.h"
#include "engine/core/check.h"

namespace core {

bool cuda_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

std::unique_ptr<Backend> make_cuda_backend(int device_index) {
  ENGINE_FAIL("cuda:" + std::to_string(device_index) + ": the CUDA backend is not built yet");
}

}  // namespace core
