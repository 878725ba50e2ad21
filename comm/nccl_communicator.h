// NcclCommunicator: Communicator over NCCL for CUDA device buffers (built with ENGINE_HAVE_CUDA).
//
// - Created collectively from a host (MPI) communicator: rank 0 makes the NCCL unique id, which
//   travels by broadcast_bytes over the host communicator.
// - All collectives run on one CUDA stream owned by the communicator. Each first waits (an
//   event) for what the backend has issued on its compute stream so far; a Work records an event
//   after its collective, and wait() makes the compute stream wait for it, so the host never
//   blocks and the backward's kernels run while a bucket of gradients is reduced. copy_local
//   runs on the compute stream.
// - Uneven reduce_scatter / all_gather are groups (ncclGroupStart/End) of one ncclReduce /
//   ncclBroadcast per rank with a non-zero count; equal counts use ncclReduceScatter /
//   ncclAllGather. Avg is ncclAvg.
// - The double and int64 all_reduce, broadcast(double), broadcast_bytes and barrier take HOST
//   buffers (loss sums, token counts, config text) and go through the host communicator.
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "core/backend.h"

namespace comm {

// Collective over `host`; works on the device of `backend` (a CUDA backend) in the order of its
// stream. The backend must outlive the communicator.
std::unique_ptr<Communicator> make_nccl(Communicator& host, core::Backend& backend);

}  // namespace comm
