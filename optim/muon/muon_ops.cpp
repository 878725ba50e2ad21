#include "optim/muon/muon_ops.h"

namespace optim {

void MuonOps::newton_schulz_many(std::span<const NewtonSchulzJob> jobs,
                                 const NewtonSchulzSchedule& schedule) {
  for (const NewtonSchulzJob& j : jobs)
    newton_schulz(j.x, j.rows, j.cols, schedule, j.count);
}

std::unique_ptr<MuonOps> make_muon_ops(core::Backend& backend) {
#ifdef ENGINE_HAVE_CUDA
  if (backend.device().is_cuda()) return make_cuda_muon_ops(backend);
#endif
  return make_cpu_muon_ops(backend);
}

}  // namespace optim
