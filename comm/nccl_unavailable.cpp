// Built without the CUDA toolkit: the NCCL communicator exists only as a clear error.
#include <string>

#include "comm/nccl_communicator.h"
#include "core/check.h"

namespace comm {

std::unique_ptr<Communicator> make_nccl(Communicator& host, core::Backend& backend) {
  ENGINE_FAIL("rank " + std::to_string(host.rank()) + ": NCCL on " + backend.name() +
              " requested, but this build has no CUDA backend (cmake -DENGINE_CUDA=ON on a "
              "machine with the CUDA toolkit and NCCL)");
}

}  // namespace comm
