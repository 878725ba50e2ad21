#include "comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <string>
#include <utility>

#include "core/check.h"
#include "core/cuda/cuda_backend.h"
#include "core/transfer.h"

namespace comm {

namespace {

void check_cuda(cudaError_t rc, const char* what, int rank) {
  if (rc == cudaSuccess) return;
  ENGINE_FAIL(std::string(what) + " failed on rank " + std::to_string(rank) + ": " +
              cudaGetErrorString(rc));
}

void check_nccl(ncclResult_t rc, const char* what, int rank) {
  if (rc == ncclSuccess) return;
  ENGINE_FAIL(std::string(what) + " failed on rank " + std::to_string(rank) + ": " +
              ncclGetErrorString(rc));
}

ncclRedOp_t to_nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return ncclSum;
    case ReduceOp::Avg:
      return ncclAvg;
    case ReduceOp::Max:
      return ncclMax;
    case ReduceOp::Min:
      return ncclMin;
  }
  return ncclSum;
}

bool all_equal(std::span<const int64_t> counts) {
  for (int64_t c : counts) {
    if (c != counts[0]) return false;
  }
  return true;
}

// A collective issued on the communicator's stream. wait() orders the compute stream after it
// (the device waits, not the host): every later kernel, copy and host read of the backend sees
// its result. test() asks whether it is done. Destroying a Work that was neither waited for
// nor seen done blocks the host until it is (its buffers may be freed next).
class NcclWork final : public Work {
 public:
  NcclWork(cudaStream_t nccl, cudaStream_t compute, int rank) : compute_(compute), rank_(rank) {
    check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate", rank_);
    check_cuda(cudaEventRecord(event_, nccl), "cudaEventRecord", rank_);
  }
  ~NcclWork() override {
    if (!ordered_) cudaEventSynchronize(event_);
    cudaEventDestroy(event_);  // released once the event completes
  }
  void wait() override {
    check_cuda(cudaStreamWaitEvent(compute_, event_, 0), "cudaStreamWaitEvent", rank_);
    ordered_ = true;
  }
  bool test() override {
    cudaError_t rc = cudaEventQuery(event_);
    if (rc == cudaErrorNotReady) {
      // Not an error: clear it from the last-error slot (only if it is what sits there) so the
      // next checked launch does not report it.
      if (cudaPeekAtLastError() == cudaErrorNotReady) cudaGetLastError();
      return false;
    }
    check_cuda(rc, "cudaEventQuery", rank_);
    ordered_ = true;  // done: whatever the host issues next comes after it
    return true;
  }

 private:
  cudaEvent_t event_ = nullptr;
  cudaStream_t compute_;
  int rank_;
  bool ordered_ = false;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::unique_ptr<Communicator> host, ncclComm_t comm, int cuda_device,
                   cudaStream_t compute)
      : Communicator(host->rank(), host->size()),
        host_(std::move(host)),
        comm_(comm),
        cuda_device_(cuda_device),
        compute_(compute) {
    check_cuda(cudaSetDevice(cuda_device_), "cudaSetDevice", rank());
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate",
               rank());
    check_cuda(cudaEventCreateWithFlags(&compute_done_, cudaEventDisableTiming), "cudaEventCreate",
               rank());
  }
  ~NcclCommunicator() override {
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
    cudaEventDestroy(compute_done_);
    cudaStreamDestroy(stream_);
  }

  core::Device device() const override { return core::Device::cuda(cuda_device_); }
  std::string name() const override {
    return "nccl " + std::to_string(rank()) + "/" + std::to_string(size()) +
           " on cuda:" + std::to_string(cuda_device_);
  }

  std::unique_ptr<Work> all_reduce_async(float* buf, int64_t count, ReduceOp op) override {
    stats_.record(Collective::AllReduce, count * static_cast<int64_t>(sizeof(float)));
    after_compute();
    check_nccl(ncclAllReduce(buf, buf, static_cast<size_t>(count), ncclFloat, to_nccl_op(op), comm_,
                             stream_),
               "ncclAllReduce", rank());
    return std::make_unique<NcclWork>(stream_, compute_, rank());
  }
  using Communicator::all_reduce;
  void all_reduce(double* buf, int64_t count, ReduceOp op) override {
    host_->all_reduce(buf, count, op);
    stats_.record(Collective::AllReduce, count * static_cast<int64_t>(sizeof(double)));
  }
  void all_reduce(int64_t* buf, int64_t count, ReduceOp op) override {
    host_->all_reduce(buf, count, op);
    stats_.record(Collective::AllReduce, count * static_cast<int64_t>(sizeof(int64_t)));
  }
  void all_reduce_on_device(double* buf, int64_t count, ReduceOp op) override {
    stats_.record(Collective::AllReduce, count * static_cast<int64_t>(sizeof(double)));
    after_compute();
    check_nccl(ncclAllReduce(buf, buf, static_cast<size_t>(count), ncclDouble, to_nccl_op(op),
                             comm_, stream_),
               "ncclAllReduce(double)", rank());
    NcclWork(stream_, compute_, rank()).wait();  // the compute stream waits, not the host
  }

  std::unique_ptr<Work> reduce_scatter_async(const float* send, float* recv,
                                             std::span<const int64_t> counts,
                                             ReduceOp op) override {
    int64_t total = check_counts("reduce_scatter", counts);
    stats_.record(Collective::ReduceScatter, total * static_cast<int64_t>(sizeof(float)));
    after_compute();
    if (all_equal(counts)) {
      check_nccl(ncclReduceScatter(send, recv, static_cast<size_t>(counts[0]), ncclFloat,
                                   to_nccl_op(op), comm_, stream_),
                 "ncclReduceScatter", rank());
    } else {
      // One reduce to each rank's block owner; the group makes them one fused launch.
      check_nccl(ncclGroupStart(), "ncclGroupStart", rank());
      int64_t offset = 0;
      for (int r = 0; r < size(); ++r) {
        if (counts[r] > 0) {
          check_nccl(ncclReduce(send + offset, recv, static_cast<size_t>(counts[r]), ncclFloat,
                                to_nccl_op(op), r, comm_, stream_),
                     "ncclReduce", rank());
        }
        offset += counts[r];
      }
      check_nccl(ncclGroupEnd(), "ncclGroupEnd", rank());
    }
    return std::make_unique<NcclWork>(stream_, compute_, rank());
  }

  std::unique_ptr<Work> all_gather_async(const float* send, float* recv,
                                         std::span<const int64_t> counts) override {
    check_counts("all_gather", counts);
    stats_.record(Collective::AllGather, counts[rank()] * static_cast<int64_t>(sizeof(float)));
    after_compute();
    if (all_equal(counts)) {
      check_nccl(
          ncclAllGather(send, recv, static_cast<size_t>(counts[0]), ncclFloat, comm_, stream_),
          "ncclAllGather", rank());
    } else {
      check_nccl(ncclGroupStart(), "ncclGroupStart", rank());
      int64_t offset = 0;
      for (int r = 0; r < size(); ++r) {
        if (counts[r] > 0) {
          check_nccl(ncclBroadcast(send, recv + offset, static_cast<size_t>(counts[r]), ncclFloat,
                                   r, comm_, stream_),
                     "ncclBroadcast", rank());
        }
        offset += counts[r];
      }
      check_nccl(ncclGroupEnd(), "ncclGroupEnd", rank());
    }
    return std::make_unique<NcclWork>(stream_, compute_, rank());
  }

  std::unique_ptr<Work> broadcast_async(float* buf, int64_t count, int root) override {
    check_root("broadcast", root);
    stats_.record(Collective::Broadcast,
                  rank() == root ? count * static_cast<int64_t>(sizeof(float)) : 0);
    after_compute();
    check_nccl(ncclBroadcast(buf, buf, static_cast<size_t>(count), ncclFloat, root, comm_, stream_),
               "ncclBroadcast", rank());
    return std::make_unique<NcclWork>(stream_, compute_, rank());
  }
  using Communicator::broadcast;
  void broadcast(double* buf, int64_t count, int root) override {
    host_->broadcast(buf, count, root);
    stats_.record(Collective::Broadcast,
                  rank() == root ? count * static_cast<int64_t>(sizeof(double)) : 0);
  }
  void broadcast_bytes(void* buf, int64_t bytes, int root) override {
    host_->broadcast_bytes(buf, bytes, root);
    stats_.record(Collective::Broadcast, rank() == root ? bytes : 0);
  }
  void barrier() override {
    check_cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", rank());
    check_cuda(cudaStreamSynchronize(compute_), "cudaStreamSynchronize", rank());
    host_->barrier();
    stats_.record(Collective::Barrier, 0);
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    std::unique_ptr<Communicator> host = host_->split(color, key);
    ncclComm_t sub = nullptr;
    check_nccl(ncclCommSplit(comm_, color, key, &sub, nullptr), "ncclCommSplit", rank());
    return std::make_unique<NcclCommunicator>(std::move(host), sub, cuda_device_, compute_);
  }

  // On the compute stream: packing before a collective is then ordered before it (each
  // collective waits for the compute stream), unpacking after a waited one after it.
  void copy_local(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0 || dst == src) return;
    check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, compute_),
               "cudaMemcpyAsync", rank());
  }

 private:
  // Orders this communicator's stream after everything issued so far on the compute stream
  // (the buffer a collective reads was written there; a block it writes may have been freed
  // there).
  void after_compute() {
    check_cuda(cudaEventRecord(compute_done_, compute_), "cudaEventRecord", rank());
    check_cuda(cudaStreamWaitEvent(stream_, compute_done_, 0), "cudaStreamWaitEvent", rank());
  }

  std::unique_ptr<Communicator> host_;
  ncclComm_t comm_;
  int cuda_device_;
  cudaStream_t compute_;                // the backend's stream
  cudaStream_t stream_ = nullptr;       // the collectives'
  cudaEvent_t compute_done_ = nullptr;  // after_compute's mark on the compute stream
};

}  // namespace

std::unique_ptr<Communicator> make_nccl(Communicator& host, core::Backend& backend) {
  ENGINE_CHECK(core::is_host_memory(host.device()),
               "make_nccl: the host communicator must move host memory");
  auto* cuda = dynamic_cast<core::CudaBackend*>(&backend);
  ENGINE_CHECK(cuda != nullptr, "rank " + std::to_string(host.rank()) +
                                    ": NCCL needs a CUDA backend, got " + backend.name());
  const int cuda_device = cuda->device().index;
  check_cuda(cudaSetDevice(cuda_device), "cudaSetDevice", host.rank());
  ncclUniqueId id;
  if (host.rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId", host.rank());
  host.broadcast_bytes(&id, sizeof(id), 0);
  ncclComm_t comm = nullptr;
  check_nccl(ncclCommInitRank(&comm, host.size(), id, host.rank()), "ncclCommInitRank",
             host.rank());
  // A private duplicate of the host group for the host-buffer operations.
  return std::make_unique<NcclCommunicator>(host.split(0, host.rank()), comm, cuda_device,
                                            cuda->stream());
}

}  // namespace comm
