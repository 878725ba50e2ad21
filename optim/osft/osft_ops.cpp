#include "optim/osft/osft_ops.h"

namespace optim {

std::unique_ptr<OsftOps> make_osft_ops(core::Backend& backend) {
#ifdef ENGINE_HAVE_CUDA
  if (backend.device().is_cuda()) return make_cuda_osft_ops(backend);
#endif
  return make_cpu_osft_ops(backend);
}

}  // namespace optim
