#include "optim/muon/muon_ops.h"

namespace optim {

std::unique_ptr<MuonOps> make_muon_ops(core::Backend& backend) {
#ifdef ENGINE_HAVE_CUDA
  if (backend.device().is_cuda()) return make_cuda_muon_ops(backend);
#endif
  return make_cpu_muon_ops(backend);
}

}  // namespace optim
