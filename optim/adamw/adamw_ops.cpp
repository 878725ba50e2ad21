#include "optim/adamw/adamw_ops.h"

namespace optim {

std::unique_ptr<AdamWOps> make_adamw_ops(core::Backend& backend) {
#ifdef ENGINE_HAVE_CUDA
  if (backend.device().is_cuda()) return make_cuda_adamw_ops(backend);
#endif
  return make_cpu_adamw_ops(backend);
}

}  // namespace optim
