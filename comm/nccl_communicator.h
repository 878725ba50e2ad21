// NcclCommunicator: Communicator over NCCL for CUDA device buffers (built with ENGINE_HAVE_CUDA).
//
// - Created collectively from a host (MPI) communicator: rank 0 makes the NCCL unique id, which
//   travels by broadcast_bytes over the host communicator.
// - All collectives run on one CUDA stream owned by the communicator, created blocking with
//   respect to the legacy default stream, so work the backend queued on the default stream is
//   ordered before them. A Work records an event after its collective; wait() synchronises on it.
// - Uneven reduce_scatter / all_gather are groups (ncclGroupStart/End) of one ncclReduce /
//   ncclBroadcast per rank with a non-zero count; equal counts use ncclReduceScatter /
//   ncclAllGather. Avg is ncclAvg.
// - The double and int64 all_reduce, broadcast(double), broadcast_bytes and barrier take HOST
//   buffers (loss sums, token counts, config text) and go through the host communicator.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace comm {

// Collective over `host`; binds this process to CUDA device `cuda_device`.
std::unique_ptr<Communicator> make_nccl(Communicator& host, int cuda_device);

}  // namespace comm
