// MpiCommunicator: Communicator over an MPI communicator, for host buffers.
//
// Async forms use MPI's nonblocking collectives (MPI_Iallreduce, MPI_Ireduce_scatter with uneven
// counts, MPI_Iallgatherv, MPI_Ibcast; the *_block / MPI_Iallgather forms when counts are
// equal; the blocking calls instead after set_blocking_async); blocking forms use the blocking
// calls, whose tuned algorithms are faster (bench_comm).
// Large reduce_scatters use our own ring (see set_ring_min_bytes).
// Avg is Sum followed by a scale by 1/size on completion. Open MPI
// progresses nonblocking collectives inside MPI calls, so Work::test() also drives progress.
// The MPI communicator is set to MPI_ERRORS_RETURN and failures throw core::Error.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace comm {

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm` when `owned` (freed in the destructor, before MPI_Finalize).
  MpiCommunicator(MPI_Comm comm, bool owned, std::string label);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  core::Device device() const override { return core::Device::cpu(); }
  std::string name() const override;

  // A reduce_scatter of at least this many bytes (the whole send buffer) runs as a ring over
  // MPI_Sendrecv instead of MPI_[I]reduce_scatter[_block]: 1.1-4x faster from 1 MiB to 64 MiB at
  // np 2 and 4 here (bench_comm). Its async form then completes before returning.
  static constexpr int64_t kDefaultRingMinBytes = int64_t{1} << 20;
  void set_ring_min_bytes(int64_t bytes) { ring_min_bytes_ = bytes; }

  std::unique_ptr<Work> all_reduce_async(float* buf, int64_t count, ReduceOp op) override;
  void all_reduce(float* buf, int64_t count, ReduceOp op) override;
  void all_reduce(double* buf, int64_t count, ReduceOp op) override;
  void all_reduce(int64_t* buf, int64_t count, ReduceOp op) override;
  void all_reduce_on_device(double* buf, int64_t count, ReduceOp op) override {
    all_reduce(buf, count, op);  // the host is this communicator's device
  }
  std::unique_ptr<Work> reduce_scatter_async(const float* send, float* recv,
                                             std::span<const int64_t> counts, ReduceOp op) override;
  void reduce_scatter(const float* send, float* recv, std::span<const int64_t> counts,
                      ReduceOp op) override;
  std::unique_ptr<Work> all_gather_async(const float* send, float* recv,
                                         std::span<const int64_t> counts) override;
  void all_gather(const float* send, float* recv, std::span<const int64_t> counts) override;
  std::unique_ptr<Work> broadcast_async(float* buf, int64_t count, int root) override;
  using Communicator::broadcast;
  void broadcast(double* buf, int64_t count, int root) override;
  void broadcast_bytes(void* buf, int64_t bytes, int root) override;
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key) override;
  void copy_local(void* dst, const void* src, size_t bytes) override;

 private:
  // int counts and displacements of an uneven collective; `equal` selects the *_block forms.
  struct Layout {
    std::vector<int> counts, displs;
    bool equal = true;
    int total() const { return counts.empty() ? 0 : displs.back() + counts.back(); }
  };
  Layout layout(const char* what, std::span<const int64_t> counts) const;
  void scale(float* buf, int64_t count) const;  // *= 1/size(), the second half of Avg
  bool use_ring(const Layout& l) const;
  void ring_reduce_scatter(const float* send, float* recv, const Layout& l, ReduceOp op);

  MPI_Comm comm_;
  MPI_Comm ring_comm_ = MPI_COMM_NULL;
  int64_t ring_min_bytes_ = kDefaultRingMinBytes;
  std::unique_ptr<float[]> ring_scratch_;
  size_t ring_scratch_size_ = 0;
  bool owned_;
  std::string label_;
};

// Throws core::Error "<what> failed on rank R: <MPI error string>" when rc != MPI_SUCCESS.
void check_mpi(int rc, const char* what, int rank);

}  // namespace comm
