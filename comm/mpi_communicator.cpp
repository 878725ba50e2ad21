#include "comm/mpi_communicator.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "comm/composite_work.h"
#include "core/check.h"

namespace comm {

void check_mpi(int rc, const char* what, int rank) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  ENGINE_FAIL(std::string(what) + " failed on rank " + std::to_string(rank) + ": " +
              std::string(text, length));
}

namespace {

int to_int(int64_t n, const char* what, int rank) {
  ENGINE_CHECK(n >= 0 && n <= INT_MAX, std::string(what) + " on rank " + std::to_string(rank) +
                                           ": count " + std::to_string(n) +
                                           " does not fit an MPI int count");
  return static_cast<int>(n);
}

MPI_Op to_mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg:
      return MPI_SUM;
    case ReduceOp::Max:
      return MPI_MAX;
    case ReduceOp::Min:
      return MPI_MIN;
  }
  return MPI_SUM;
}

// One outstanding nonblocking collective. Avg scales the result once it has arrived; the count
// and displacement arrays MPI reads during the operation live here until completion.
class MpiWork final : public Work {
 public:
  MpiWork(int rank, const char* what, CommStats& stats) : rank_(rank), what_(what), stats_(stats) {}
  ~MpiWork() override {
    if (done_) return;
    try {
      wait();
    } catch (const std::exception&) {
      // A destructor cannot report; the failure already surfaced or will at the next call.
    }
  }

  void wait() override {
    if (done_) return;
    ScopedWait timer(stats_);
    check_mpi(MPI_Wait(&request_, MPI_STATUS_IGNORE), what_, rank_);
    finish();
  }

  bool test() override {
    if (done_) return true;
    int flag = 0;
    check_mpi(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE), what_, rank_);
    if (flag) finish();
    return done_;
  }

  MPI_Request request_ = MPI_REQUEST_NULL;
  float* scale_buf_ = nullptr;
  int64_t scale_count_ = 0;
  float scale_ = 1.0f;
  std::vector<int> counts_, displs_;

 private:
  void finish() {
    done_ = true;
    for (int64_t i = 0; i < scale_count_; ++i)
      scale_buf_[i] *= scale_;
  }

  int rank_;
  const char* what_;
  CommStats& stats_;
  bool done_ = false;
};

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, bool owned, std::string label)
    : Communicator(
          [&] {
            int r = 0;
            MPI_Comm_rank(comm, &r);
            return r;
          }(),
          [&] {
            int s = 0;
            MPI_Comm_size(comm, &s);
            return s;
          }()),
      comm_(comm),
      owned_(owned),
      label_(std::move(label)) {
  check_mpi(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", rank());
  // A private duplicate for the point-to-point traffic of our own algorithms, so their tags can
  // never match a message of the library's collectives.
  check_mpi(MPI_Comm_dup(comm_, &ring_comm_), "MPI_Comm_dup", rank());
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  MPI_Comm_free(&ring_comm_);
  if (owned_) MPI_Comm_free(&comm_);
}

std::string MpiCommunicator::name() const {
  return "mpi " + label_ + " " + std::to_string(rank()) + "/" + std::to_string(size());
}

std::unique_ptr<Work> MpiCommunicator::all_reduce_async(float* buf, int64_t count, ReduceOp op) {
  if (blocking_async_) {
    all_reduce(buf, count, op);
    return std::make_unique<DoneWork>();
  }
  auto work = std::make_unique<MpiWork>(rank(), "MPI_Iallreduce", stats_);
  int n = to_int(count, "all_reduce", rank());
  stats_.record(Collective::AllReduce, count * static_cast<int64_t>(sizeof(float)));
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, to_mpi_op(op), comm_, &work->request_),
            "MPI_Iallreduce", rank());
  if (op == ReduceOp::Avg) {
    work->scale_buf_ = buf;
    work->scale_count_ = count;
    work->scale_ = 1.0f / static_cast<float>(size());
  }
  return work;
}

void MpiCommunicator::all_reduce(float* buf, int64_t count, ReduceOp op) {
  ScopedWait timer(stats_);
  int n = to_int(count, "all_reduce", rank());
  stats_.record(Collective::AllReduce, count * static_cast<int64_t>(sizeof(float)));
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, to_mpi_op(op), comm_), "MPI_Allreduce",
            rank());
  if (op == ReduceOp::Avg) scale(buf, count);
}

void MpiCommunicator::scale(float* buf, int64_t count) const {
  const float factor = 1.0f / static_cast<float>(size());
  for (int64_t i = 0; i < count; ++i)
    buf[i] *= factor;
}

void MpiCommunicator::all_reduce(double* buf, int64_t count, ReduceOp op) {
  ScopedWait timer(stats_);
  int n = to_int(count, "all_reduce(double)", rank());
  stats_.record(Collective::AllReduce, count * static_cast<int64_t>(sizeof(double)));
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_DOUBLE, to_mpi_op(op), comm_),
            "MPI_Allreduce(double)", rank());
  if (op == ReduceOp::Avg) {
    for (int64_t i = 0; i < count; ++i)
      buf[i] /= static_cast<double>(size());
  }
}

void MpiCommunicator::all_reduce(int64_t* buf, int64_t count, ReduceOp op) {
  ScopedWait timer(stats_);
  ENGINE_CHECK(op != ReduceOp::Avg, "all_reduce(int64) on rank " + std::to_string(rank()) +
                                        ": Avg is not defined for integers (use Sum)");
  int n = to_int(count, "all_reduce(int64)", rank());
  stats_.record(Collective::AllReduce, count * static_cast<int64_t>(sizeof(int64_t)));
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_INT64_T, to_mpi_op(op), comm_),
            "MPI_Allreduce(int64)", rank());
}

MpiCommunicator::Layout MpiCommunicator::layout(const char* what,
                                                std::span<const int64_t> counts) const {
  int64_t total = check_counts(what, counts);
  to_int(total, what, rank());
  Layout l;
  l.counts.resize(counts.size());
  l.displs.resize(counts.size());
  int offset = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    l.counts[r] = static_cast<int>(counts[r]);
    l.displs[r] = offset;
    offset += l.counts[r];
    l.equal = l.equal && l.counts[r] == l.counts[0];
  }
  return l;
}

std::unique_ptr<Work> MpiCommunicator::reduce_scatter_async(const float* send, float* recv,
                                                            std::span<const int64_t> counts,
                                                            ReduceOp op) {
  if (blocking_async_) {
    reduce_scatter(send, recv, counts, op);
    return std::make_unique<DoneWork>();
  }
  Layout l = layout("reduce_scatter", counts);
  stats_.record(Collective::ReduceScatter, int64_t{l.total()} * sizeof(float));
  auto work = std::make_unique<MpiWork>(rank(), "MPI_Ireduce_scatter", stats_);
  if (use_ring(l)) {
    // Done at once: faster than the library's nonblocking form even without overlap, and Open
    // MPI only progresses that inside MPI calls anyway. The returned work is already complete.
    ScopedWait timer(stats_);
    ring_reduce_scatter(send, recv, l, op);
    if (op == ReduceOp::Avg) scale(recv, counts[rank()]);
    return work;
  }
  if (l.equal) {
    check_mpi(MPI_Ireduce_scatter_block(send, recv, l.counts[0], MPI_FLOAT, to_mpi_op(op), comm_,
                                        &work->request_),
              "MPI_Ireduce_scatter_block", rank());
  } else {
    work->counts_ = std::move(l.counts);
    check_mpi(MPI_Ireduce_scatter(send, recv, work->counts_.data(), MPI_FLOAT, to_mpi_op(op), comm_,
                                  &work->request_),
              "MPI_Ireduce_scatter", rank());
  }
  if (op == ReduceOp::Avg) {
    work->scale_buf_ = recv;
    work->scale_count_ = counts[rank()];
    work->scale_ = 1.0f / static_cast<float>(size());
  }
  return work;
}

void MpiCommunicator::reduce_scatter(const float* send, float* recv,
                                     std::span<const int64_t> counts, ReduceOp op) {
  Layout l = layout("reduce_scatter", counts);
  ScopedWait timer(stats_);
  stats_.record(Collective::ReduceScatter, int64_t{l.total()} * sizeof(float));
  if (use_ring(l)) {
    ring_reduce_scatter(send, recv, l, op);
  } else if (l.equal) {
    check_mpi(MPI_Reduce_scatter_block(send, recv, l.counts[0], MPI_FLOAT, to_mpi_op(op), comm_),
              "MPI_Reduce_scatter_block", rank());
  } else {
    check_mpi(MPI_Reduce_scatter(send, recv, l.counts.data(), MPI_FLOAT, to_mpi_op(op), comm_),
              "MPI_Reduce_scatter", rank());
  }
  if (op == ReduceOp::Avg) scale(recv, counts[rank()]);
}

bool MpiCommunicator::use_ring(const Layout& l) const {
  return size() > 1 && int64_t{l.total()} * int64_t{sizeof(float)} >= ring_min_bytes_;
}

// Ring reduce-scatter: W-1 steps; at step s rank q passes its partial of block (q-1-s) mod W to
// q+1 and receives the partial of block (q-2-s) mod W from q-1, which it combines with its own
// contribution. The partial of block b starts at rank b+1 and ends, complete, at rank b. Each
// rank sends (W-1)/W of the data once, the bandwidth optimum.
void MpiCommunicator::ring_reduce_scatter(const float* send, float* recv, const Layout& l,
                                          ReduceOp op) {
  const int W = size(), q = rank();
  const int next = (q + 1) % W, prev = (q - 1 + W) % W;
  const size_t max_count = *std::max_element(l.counts.begin(), l.counts.end());
  if (ring_scratch_size_ < 2 * max_count) {  // kept between calls: no page faults per call
    ring_scratch_.reset(new float[2 * max_count]);
    ring_scratch_size_ = 2 * max_count;
  }
  float* incoming = ring_scratch_.get();
  float* partial = incoming + max_count;
  auto combine = [op](float* out, const float* a, const float* b, int n) {
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg:
        for (int i = 0; i < n; ++i)
          out[i] = a[i] + b[i];
        break;
      case ReduceOp::Max:
        for (int i = 0; i < n; ++i)
          out[i] = std::max(a[i], b[i]);
        break;
      case ReduceOp::Min:
        for (int i = 0; i < n; ++i)
          out[i] = std::min(a[i], b[i]);
        break;
    }
  };
  for (int s = 0; s < W - 1; ++s) {
    const int out_block = ((q - 1 - s) % W + W) % W;
    const int in_block = ((q - 2 - s) % W + W) % W;
    const float* out = s == 0 ? send + l.displs[out_block] : partial;
    check_mpi(MPI_Sendrecv(out, l.counts[out_block], MPI_FLOAT, next, s, incoming,
                           l.counts[in_block], MPI_FLOAT, prev, s, ring_comm_, MPI_STATUS_IGNORE),
              "MPI_Sendrecv (ring reduce_scatter)", rank());
    float* dst = s == W - 2 ? recv : partial;
    combine(dst, incoming, send + l.displs[in_block], l.counts[in_block]);
  }
}

std::unique_ptr<Work> MpiCommunicator::all_gather_async(const float* send, float* recv,
                                                        std::span<const int64_t> counts) {
  if (blocking_async_) {
    all_gather(send, recv, counts);
    return std::make_unique<DoneWork>();
  }
  Layout l = layout("all_gather", counts);
  stats_.record(Collective::AllGather, counts[rank()] * static_cast<int64_t>(sizeof(float)));
  // A send block already in place inside recv is MPI_IN_PLACE (e.g. a dim-0 shard that is a view
  // of the full parameter).
  const void* send_arg = send == recv + l.displs[rank()] ? MPI_IN_PLACE : send;
  auto work = std::make_unique<MpiWork>(rank(), "MPI_Iallgatherv", stats_);
  if (l.equal) {
    check_mpi(MPI_Iallgather(send_arg, l.counts[0], MPI_FLOAT, recv, l.counts[0], MPI_FLOAT, comm_,
                             &work->request_),
              "MPI_Iallgather", rank());
  } else {
    work->counts_ = std::move(l.counts);
    work->displs_ = std::move(l.displs);
    check_mpi(
        MPI_Iallgatherv(send_arg, work->counts_[rank()], MPI_FLOAT, recv, work->counts_.data(),
                        work->displs_.data(), MPI_FLOAT, comm_, &work->request_),
        "MPI_Iallgatherv", rank());
  }
  return work;
}

void MpiCommunicator::all_gather(const float* send, float* recv, std::span<const int64_t> counts) {
  ScopedWait timer(stats_);
  Layout l = layout("all_gather", counts);
  stats_.record(Collective::AllGather, counts[rank()] * static_cast<int64_t>(sizeof(float)));
  const void* send_arg = send == recv + l.displs[rank()] ? MPI_IN_PLACE : send;
  if (l.equal) {
    check_mpi(MPI_Allgather(send_arg, l.counts[0], MPI_FLOAT, recv, l.counts[0], MPI_FLOAT, comm_),
              "MPI_Allgather", rank());
  } else {
    check_mpi(MPI_Allgatherv(send_arg, l.counts[rank()], MPI_FLOAT, recv, l.counts.data(),
                             l.displs.data(), MPI_FLOAT, comm_),
              "MPI_Allgatherv", rank());
  }
}

std::unique_ptr<Work> MpiCommunicator::broadcast_async(float* buf, int64_t count, int root) {
  check_root("broadcast", root);
  int n = to_int(count, "broadcast", rank());
  auto work = std::make_unique<MpiWork>(rank(), "MPI_Ibcast", stats_);
  stats_.record(Collective::Broadcast,
                rank() == root ? count * static_cast<int64_t>(sizeof(float)) : 0);
  check_mpi(MPI_Ibcast(buf, n, MPI_FLOAT, root, comm_, &work->request_), "MPI_Ibcast", rank());
  return work;
}

void MpiCommunicator::broadcast(double* buf, int64_t count, int root) {
  ScopedWait timer(stats_);
  check_root("broadcast(double)", root);
  int n = to_int(count, "broadcast(double)", rank());
  stats_.record(Collective::Broadcast,
                rank() == root ? count * static_cast<int64_t>(sizeof(double)) : 0);
  check_mpi(MPI_Bcast(buf, n, MPI_DOUBLE, root, comm_), "MPI_Bcast(double)", rank());
}

void MpiCommunicator::broadcast_bytes(void* buf, int64_t bytes, int root) {
  ScopedWait timer(stats_);
  check_root("broadcast_bytes", root);
  int n = to_int(bytes, "broadcast_bytes", rank());
  stats_.record(Collective::Broadcast, rank() == root ? bytes : 0);
  check_mpi(MPI_Bcast(buf, n, MPI_BYTE, root, comm_), "MPI_Bcast(bytes)", rank());
}

void MpiCommunicator::barrier() {
  ScopedWait timer(stats_);
  stats_.record(Collective::Barrier, 0);
  check_mpi(MPI_Barrier(comm_), "MPI_Barrier", rank());
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) {
  ENGINE_CHECK(color >= 0, "split on rank " + std::to_string(rank()) + ": color " +
                               std::to_string(color) + " must be >= 0");
  MPI_Comm sub = MPI_COMM_NULL;
  check_mpi(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split", rank());
  return std::make_unique<MpiCommunicator>(sub, true, label_ + ".split" + std::to_string(color));
}

void MpiCommunicator::copy_local(void* dst, const void* src, size_t bytes) {
  if (bytes > 0 && dst != src) std::memcpy(dst, src, bytes);
}

std::unique_ptr<Communicator> make_mpi_world() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  ENGINE_CHECK(initialized, "make_mpi_world: MPI is not initialised (create a comm::MpiSession)");
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, false, "world");
}

}  // namespace comm
