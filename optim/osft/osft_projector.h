// OsftProjector: removes from row-sharded U-like and V-like matrices their components in the
// frozen singular subspaces of each OSFT target (docs/specs/osft.md sections 6 and 9):
//   X_U <- X_U - U_high (U_high^T X_U)        X_U [N, r], rows sharded like U_high
//   X_V <- X_V - (X_V V_high^T) V_high        X_V [r, M], rows sharded along r
// The same pass serves the gradient projection (before AdamW) and the parameter projection
// (after it). Every product is an OSFT op (osft_ops.h) on tensors in the backend's memory, so a
// pass issues kernels only.
//
// Communication per pass, over all targets together: one all-reduce of the concatenated partial
// coefficients U_high,p^T X_U,p ([k, r] per target, in target order), and, unless V_high is
// cached, one all-gather of every target's V_high rows (uneven counts; the communicator pads
// where its backend needs equal blocks). Every rank joins every collective: whether one runs is
// decided from the global shapes, never from this rank's row count (the reference deadlocks
// when k_high < world size, spec section 13). On a device the float64 coefficients are summed
// without a host copy: all-gathered as raw bytes, then added in rank order on the device
// (OsftOps::sum_partials); on the CPU they go through the communicator's float64
// all-reduce.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/placement.h"
#include "core/backend.h"
#include "core/tensor.h"
#include "optim/osft/osft_ops.h"

namespace optim {

// How a factor's rows are split over the ranks: the rows of an n-row factor rank r holds. The
// reference (and the golden files) use torch.chunk counts (osft_rows); a sharding plan may use
// its own balanced split (comm::shard_range). The projection is the same up to summation order.
using RowSplit = comm::Range (*)(int64_t n, int world_size, int rank);

// The sum over the ranks of `comm` of every rank's float64 vector partial [count], into
// total [count], both in the memory of `ops`'s backend (on the device comm moves buffers on), added
// in rank order: the partial sums all-gathered bit for bit as 2 * count floats each into gathered
// [size * count], then added by OsftOps::sum_partials. The projector's reduction on a device, whose
// communicator reduces floats only.
void osft_sum_over_ranks(comm::Communicator& comm, OsftOps& ops, const double* partial,
                         double* total, double* gathered, int64_t count);

class OsftProjector {
 public:
  // comm may be null (one process). V_high is gathered once and kept (replicated) when all
  // targets' V_high together take at most v_high_cache_bytes in f32. `split` (null: osft_rows)
  // says which rows of every factor each rank holds. `backend` runs the products; every tensor
  // and pointer given to this projector lies in its memory, and comm moves buffers on its device.
  OsftProjector(comm::Communicator* comm, int64_t v_high_cache_bytes, RowSplit split,
                core::Backend& backend);

  // Registers a target; every rank registers the same targets in the same order. U_high_rows
  // holds this rank's split(N) rows of U_high [N, k], V_high_rows its split(k) rows of
  // V_high [k, M] (either may have zero rows), both in the backend's memory.
  void add_target(const std::string& name, int64_t rows, int64_t cols, int64_t k_high,
                  core::Tensor U_high_rows, core::Tensor V_high_rows);

  size_t size() const { return targets_.size(); }
  int world_size() const { return comm_ ? comm_->size() : 1; }
  int rank() const { return comm_ ? comm_->rank() : 0; }
  bool caches_v_high() const { return cache_; }
  // This rank's rows of an n-row factor.
  comm::Range rows(int64_t n) const { return split_(n, world_size(), rank()); }
  RowSplit split() const { return split_; }

  // Projects, for every target i in order, u[i] (this rank's split(N) rows of an [N, r]
  // matrix) and v[i] (its split(r) rows of an [r, M] matrix) in place. A pointer may be
  // null where this rank holds no rows. Every rank calls this.
  void project(std::span<float* const> u, std::span<float* const> v);

  // The batched U coefficients of the last pass: this rank's partial sums and their total
  // (copied to the host; for tests and replays).
  std::vector<double> last_partial_coefficients() const;
  std::vector<double> last_coefficients() const;

 private:
  struct Target {
    std::string name;
    int64_t rows = 0, cols = 0, k_high = 0, k_low = 0;
    core::Tensor U_high_rows, V_high_rows;
  };
  void gather_v_high();
  // Sums the partial coefficients over the ranks into total_.
  void reduce_coefficients();
  std::vector<double> download(const core::Storage* buffer) const;

  comm::Communicator* comm_;
  int64_t v_high_cache_bytes_;
  RowSplit split_;
  core::Backend& backend_;
  std::unique_ptr<OsftOps> ops_;
  bool cache_ = false;
  bool projected_ = false;  // a pass ran: targets are fixed, a cached V_high is valid
  std::vector<Target> targets_;
  std::vector<core::Tensor> v_full_;  // per target, [k, M] (one process: V_high_rows itself)
  // float64 [sum over targets of k_high * k_low] in the backend's memory, sized at the first pass:
  // this rank's partial coefficients, their sum, and (on a device, world > 1) every rank's partial
  // sums as all-gathered.
  int64_t coefficient_count_ = 0;
  std::unique_ptr<core::Storage> partial_, total_, gathered_;
};

}  // namespace optim
