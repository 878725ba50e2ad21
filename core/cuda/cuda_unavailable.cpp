// Built when the CUDA toolkit is absent: the CUDA backend exists only as a clear error.
#include "core/backend.h"
#include "core/check.h"

namespace core {

bool cuda_available() {
  return false;
}

bool cuda_built() {
  return false;
}

int cuda_device_count() {
  return 0;
}

std::unique_ptr<Backend> make_cuda_backend(int device_index) {
  ENGINE_FAIL("cuda:" + std::to_string(device_index) +
              " requested, but this build has no CUDA backend (configure with ENGINE_CUDA=ON "
              "on a machine with the CUDA toolkit)");
}

}  // namespace core
