// StagedCommunicator: the device collectives over MPI (comm.device_collectives: mpi). Buffers
// live in a backend's memory (a GPU's); each collective copies its input to a host buffer, runs
// on the host (MPI) communicator, and copies the result back. It lets several ranks share one
// GPU (NCCL refuses that), runs every device code path at np >= 2 on a one-GPU machine, and is
// what a cluster without NCCL uses. A CUDA-aware Open MPI could take the device pointers
// directly; the Debian build is not, so everything is staged.
//
// - Results are the host communicator's, bit for bit: the same MPI calls on the same values.
// - Async forms copy in, start the host collective and return; wait() completes it and copies
//   the result back to the device. The staging buffers are the Work's own, so several
//   collectives may be in flight at once.
// - The double / int64 all_reduce, broadcast(double), broadcast_bytes and barrier take HOST
//   buffers, as for NCCL, and go to the host communicator directly.
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "core/backend.h"

namespace comm {

// `host` and `backend` must outlive the communicator; device() is the backend's.
std::unique_ptr<Communicator> make_staged(Communicator& host, core::Backend& backend);

}  // namespace comm
