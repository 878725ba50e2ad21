// Communicator: the collectives every distributed part of the engine goes through.
//
// One interface, two backends: MpiCommunicator (host pointers, Open MPI) and NcclCommunicator
// (CUDA device pointers, built only with ENGINE_HAVE_CUDA). Every collective has an async form
// returning a Work handle, so gradient communication of one layer can overlap the backward pass
// of the next; the blocking form is the async form plus wait().
//
// Layout conventions for the uneven collectives (counts has size() entries, zeros allowed):
// - reduce_scatter: `send` holds sum(counts) elements laid out rank by rank; rank r receives the
//   reduction of its block, counts[r] elements, in `recv`.
// - all_gather: rank r contributes counts[r] elements from `send`; `recv` (sum(counts) elements)
//   gets all contributions concatenated in rank order.
// ReduceOp::Avg is Sum followed by a scale by 1/size() (exact for power-of-two sizes only).
//
// Errors (bad counts, MPI/NCCL failures) throw core::Error naming the collective and the rank.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/device.h"

namespace comm {

enum class ReduceOp { Sum, Avg, Max, Min };
const char* reduce_op_name(ReduceOp op);

// Async handle. wait() blocks until the result is in the output buffer (for NCCL: until the
// communication stream reached it); test() polls without blocking and drives progress.
// Destroying an unwaited Work waits for it (buffers must outlive the operation).
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;
};

// Collective kinds counted by the instrumentation.
enum class Collective { AllReduce, ReduceScatter, AllGather, Broadcast, Barrier };
inline constexpr int kNumCollectives = 5;
const char* collective_name(Collective kind);

// Per collective kind: calls made and payload bytes SENT by this rank, defined as the logical
// payload this rank contributes (not the wire traffic of the algorithm):
//   all_reduce: count * elem; reduce_scatter: sum(counts) * elem (the whole send buffer);
//   all_gather: counts[rank] * elem (its own block); broadcast: count * elem on the root, 0
//   elsewhere; barrier: 0 bytes.
// So for a ZeRO-2 step, summed over ranks, reduce_scatter bytes = W * parameter bytes and
// all_gather bytes = parameter bytes.
struct CollectiveStats {
  int64_t calls = 0;
  int64_t bytes = 0;
};

class CommStats {
 public:
  const CollectiveStats& operator[](Collective kind) const {
    return per_kind_[static_cast<int>(kind)];
  }
  void record(Collective kind, int64_t bytes);
  // Time this rank spent blocked on collectives: a blocking call from start to end, an async one
  // only inside Work::wait() (not the time it was in flight behind other work).
  void add_wait(double ms) { wait_ms_ += ms; }
  // Adds another communicator's calls and bytes (not its wait time) to these.
  void add_counts(const CommStats& other);
  double wait_ms() const { return wait_ms_; }
  void reset() {
    per_kind_ = {};
    wait_ms_ = 0;
  }
  std::string str() const;  // "all_reduce 3 calls 1.2 MB, reduce_scatter ..."

 private:
  std::array<CollectiveStats, kNumCollectives> per_kind_{};
  double wait_ms_ = 0;
};

// Adds the time from construction to destruction to stats.add_wait (a blocking collective).
class ScopedWait {
 public:
  explicit ScopedWait(CommStats& stats) : stats_(stats), start_(std::chrono::steady_clock::now()) {}
  ~ScopedWait() {
    stats_.add_wait(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_)
            .count());
  }
  ScopedWait(const ScopedWait&) = delete;
  ScopedWait& operator=(const ScopedWait&) = delete;

 private:
  CommStats& stats_;
  std::chrono::steady_clock::time_point start_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Where the buffers passed to this communicator live (cpu for MPI, cuda:N for NCCL).
  virtual core::Device device() const = 0;
  virtual std::string name() const = 0;  // "mpi world 2/4", "nccl 0/2 on cuda:0"

  // ---- all_reduce (in place) -------------------------------------------------------------------
  virtual std::unique_ptr<Work> all_reduce_async(float* buf, int64_t count, ReduceOp op) = 0;
  // Blocking forms: async + wait by default; a backend may override them with faster blocking
  // calls (MPI's tuned blocking algorithms beat its nonblocking ones on small messages).
  virtual void all_reduce(float* buf, int64_t count, ReduceOp op);
  // Loss sums and token counts: blocking only, HOST buffers for every backend.
  virtual void all_reduce(double* buf, int64_t count, ReduceOp op) = 0;
  virtual void all_reduce(int64_t* buf, int64_t count, ReduceOp op) = 0;
  // float64 sums in THIS communicator's memory (the step's loss and gradient sums of squares, on
  // the device), ordered with its collectives and the backend's work: blocking on the host for
  // MPI; on a device (NCCL) the host does not wait, the backend's stream does.
  virtual void all_reduce_on_device(double* buf, int64_t count, ReduceOp op) = 0;

  // ---- reduce_scatter / all_gather with per-rank counts (see the header comment) ---------------
  virtual std::unique_ptr<Work> reduce_scatter_async(const float* send, float* recv,
                                                     std::span<const int64_t> counts,
                                                     ReduceOp op) = 0;
  virtual void reduce_scatter(const float* send, float* recv, std::span<const int64_t> counts,
                              ReduceOp op);
  virtual std::unique_ptr<Work> all_gather_async(const float* send, float* recv,
                                                 std::span<const int64_t> counts) = 0;
  virtual void all_gather(const float* send, float* recv, std::span<const int64_t> counts);

  // ---- broadcast from root, barrier -----------------------------------------------------------
  virtual std::unique_ptr<Work> broadcast_async(float* buf, int64_t count, int root) = 0;
  void broadcast(float* buf, int64_t count, int root);
  virtual void broadcast(double* buf, int64_t count, int root) = 0;  // host buffer
  // Raw bytes (config text, RNG states); `bytes` in host memory for every backend.
  virtual void broadcast_bytes(void* buf, int64_t bytes, int root) = 0;
  virtual void barrier() = 0;

  // Ranks with the same color form a new communicator, ordered by (key, old rank), like
  // MPI_Comm_split. Collective over this communicator.
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // Copy `bytes` between two buffers of this communicator's device, ordered with its
  // collectives (so sharding code can pack and unpack without knowing the device).
  virtual void copy_local(void* dst, const void* src, size_t bytes) = 0;

  // When set, the async forms of an MPI communicator run the blocking collective and return a
  // completed Work: for a communicator used only by a communication thread (comm_stream.h),
  // where blocking is that thread's job and MPI's tuned blocking algorithms beat its
  // nonblocking ones (apps/bench_comm). Other backends ignore it. Virtual so a wrapper
  // (TracedCommunicator) can pass it on to the communicator it wraps.
  virtual void set_blocking_async(bool on) { blocking_async_ = on; }

  // Virtual so a wrapper (WatchedCommunicator) can hand out the wrapped communicator's own.
  virtual const CommStats& stats() const { return stats_; }
  virtual CommStats& stats() { return stats_; }

 protected:
  Communicator(int rank, int size) : rank_(rank), size_(size) {}
  // Checks counts.size() == size() and counts >= 0; returns sum(counts).
  int64_t check_counts(const char* what, std::span<const int64_t> counts) const;
  void check_root(const char* what, int root) const;

  CommStats stats_;
  bool blocking_async_ = false;

 private:
  int rank_;
  int size_;
};

// MPI_COMM_WORLD as a Communicator (MPI must be initialised, e.g. by MpiSession).
std::unique_ptr<Communicator> make_mpi_world();

// Every rank's `text`, in rank order, on every rank (one broadcast_bytes per rank: for start-up
// reports such as the device each rank uses, not for a training step). Collective.
std::vector<std::string> all_gather_text(Communicator& comm, const std::string& text);

}  // namespace comm
