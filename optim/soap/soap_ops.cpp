#include "optim/soap/soap_ops.h"

namespace optim {

std::unique_ptr<SoapOps> make_soap_ops(core::Backend& backend) {
#ifdef ENGINE_HAVE_CUDA
  if (backend.device().is_cuda()) return make_cuda_soap_ops(backend);
#endif
  return make_cpu_soap_ops(backend);
}

}  // namespace optim
