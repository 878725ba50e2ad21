#include "comm/communicator.h"

#include <cstdio>
#include <string>

#include "core/check.h"

namespace comm {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Avg:
      return "avg";
    case ReduceOp::Max:
      return "max";
    case ReduceOp::Min:
      return "min";
  }
  return "?";
}

const char* collective_name(Collective kind) {
  switch (kind) {
    case Collective::AllReduce:
      return "all_reduce";
    case Collective::ReduceScatter:
      return "reduce_scatter";
    case Collective::AllGather:
      return "all_gather";
    case Collective::Broadcast:
      return "broadcast";
    case Collective::Barrier:
      return "barrier";
  }
  return "?";
}

void CommStats::record(Collective kind, int64_t bytes) {
  CollectiveStats& s = per_kind_[static_cast<int>(kind)];
  s.calls += 1;
  s.bytes += bytes;
}

void CommStats::add_counts(const CommStats& other) {
  for (int k = 0; k < kNumCollectives; ++k) {
    per_kind_[k].calls += other.per_kind_[k].calls;
    per_kind_[k].bytes += other.per_kind_[k].bytes;
  }
}

std::string CommStats::str() const {
  std::string out;
  for (int k = 0; k < kNumCollectives; ++k) {
    const CollectiveStats& s = per_kind_[k];
    if (s.calls == 0) continue;
    char line[128];
    std::snprintf(line, sizeof(line), "%s%s %lld calls %.3f MB", out.empty() ? "" : ", ",
                  collective_name(static_cast<Collective>(k)), static_cast<long long>(s.calls),
                  static_cast<double>(s.bytes) / 1e6);
    out += line;
  }
  return out.empty() ? "no collectives" : out;
}

void Communicator::all_reduce(float* buf, int64_t count, ReduceOp op) {
  all_reduce_async(buf, count, op)->wait();
}

void Communicator::reduce_scatter(const float* send, float* recv, std::span<const int64_t> counts,
                                  ReduceOp op) {
  reduce_scatter_async(send, recv, counts, op)->wait();
}

void Communicator::all_gather(const float* send, float* recv, std::span<const int64_t> counts) {
  all_gather_async(send, recv, counts)->wait();
}

void Communicator::broadcast(float* buf, int64_t count, int root) {
  broadcast_async(buf, count, root)->wait();
}

int64_t Communicator::check_counts(const char* what, std::span<const int64_t> counts) const {
  ENGINE_CHECK(static_cast<int>(counts.size()) == size_,
               std::string(what) + " on rank " + std::to_string(rank_) + ": " +
                   std::to_string(counts.size()) + " counts for a communicator of size " +
                   std::to_string(size_));
  int64_t total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    ENGINE_CHECK(counts[r] >= 0, std::string(what) + " on rank " + std::to_string(rank_) +
                                     ": negative count " + std::to_string(counts[r]) +
                                     " for rank " + std::to_string(r));
    total += counts[r];
  }
  return total;
}

void Communicator::check_root(const char* what, int root) const {
  ENGINE_CHECK(root >= 0 && root < size_, std::string(what) + " on rank " + std::to_string(rank_) +
                                              ": root " + std::to_string(root) + " outside [0, " +
                                              std::to_string(size_) + ")");
}

std::vector<std::string> all_gather_text(Communicator& comm, const std::string& text) {
  std::vector<std::string> out(static_cast<size_t>(comm.size()));
  for (int r = 0; r < comm.size(); ++r) {
    std::string& t = out[static_cast<size_t>(r)];
    if (r == comm.rank()) t = text;
    int64_t bytes = static_cast<int64_t>(t.size());
    comm.broadcast_bytes(&bytes, sizeof(bytes), r);
    t.resize(static_cast<size_t>(bytes));
    if (bytes > 0) comm.broadcast_bytes(t.data(), bytes, r);
  }
  return out;
}

}  // namespace comm
