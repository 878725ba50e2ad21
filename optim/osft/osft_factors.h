// OSFT factors: the split thin SVD of one weight matrix and the maps between the dense weight and
// its factors (docs/specs/osft.md sections 3 to 6).
//
// A target W [N, M] (N = out, M = in) with k = k_high frozen directions and r = min(N, M) - k
// trained ones is held as
//   W = U_high diag(S_high) V_high + U_low diag(S_low) V_low
// U_* [N, k|r], S_* [k|r], V_* [k|r, M] (rows of V^T). Only U_low, S_low, V_low train.
// Sharded, every factor is split along dim 0 by whole rows with torch.chunk counts (osft_rows).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/placement.h"
#include "core/backend.h"
#include "core/tensor.h"
#include "optim/osft/osft_ops.h"

namespace optim {

// The reference's k_high rule (mini_trainer, spec section 4): in double,
//   k = floor(min(N, M) * (1 - unfreeze_rank_ratio)); if k >= min(N, M): k = min(N, M) - 1.
// k == 0 means the matrix is not decomposed (it trains dense). The ratio must lie in [0, 1].
int64_t osft_k_high(int64_t rows, int64_t cols, double unfreeze_rank_ratio);

// Rows of a factor with n rows held by `rank` of `world_size`: torch.chunk / FSDP2 Shard(0)
// counts, ceil(n / world_size) per rank, the last non-empty rank short, trailing ranks empty.
comm::Range osft_rows(int64_t n, int world_size, int rank);

// The six factors of one target (full tensors, or one rank's rows of each).
struct OsftFactors {
  core::Tensor U_high, S_high, V_high;  // frozen
  core::Tensor U_low, S_low, V_low;     // trained
};

// Names of the factor tensors: "<target>.U_low" etc., in the order listed in OsftFactors.
inline constexpr const char* kOsftFactorNames[] = {"U_high", "S_high", "V_high",
                                                   "U_low",  "S_low",  "V_low"};
core::Tensor& factor_by_name(OsftFactors& f, const std::string& factor);
const core::Tensor& factor_by_name(const OsftFactors& f, const std::string& factor);

// Thin SVD of W (host f32 [N, M]) in float64, singular values descending, split at k_high
// (0 < k_high < min(N, M)), cast to f32. Signs are canonical: each pair (u_i, v_i) is flipped
// so that the sum of the entries of u_i is positive (the golden files' rule; the trajectory is
// sign-equivariant, so this only makes results independent of the SVD library).
OsftFactors osft_decompose(const core::Tensor& weight, int64_t k_high);

// The SVDs of many targets, spread over the ranks of `comm` (target i is decomposed by rank
// i mod size, then broadcast from it); every rank passes the same full weights (host tensors)
// and gets all full factors in `backend`'s memory (the SVD runs on the host, once per run).
// comm may be null (one process); else it moves buffers on the backend's device.
struct OsftTargetWeight {
  std::string name;
  core::Tensor weight;  // full [N, M] on the host, identical on every rank
  int64_t k_high = 0;
};
std::vector<OsftFactors> osft_decompose_all(std::span<const OsftTargetWeight> targets,
                                            comm::Communicator* comm, core::Backend& backend);

// Rows [row_begin, row_begin + out.size(0)) of the dense weight from full factors, written into
// `out` [rows, M] (OsftOps::reconstruct; factors and out in the memory of the ops' backend).
void osft_reconstruct_into(OsftOps& ops, const OsftFactors& full, const core::Tensor& out,
                           int64_t row_begin);
// The same on host factors, into a new host tensor.
core::Tensor osft_reconstruct(const OsftFactors& full, int64_t row_begin, int64_t rows);
inline core::Tensor osft_reconstruct(const OsftFactors& full) {
  return osft_reconstruct(full, 0, full.U_high.size(0));
}

// Chain rule from dW = dL/dW (full [N, M]) to the trained factors (full factors):
//   dU_low = dW V_low^T diag(S_low), dS_low[i] = u_i^T dW v_i, dV_low = diag(S_low) U_low^T dW.
struct OsftLowGrads {
  core::Tensor U_low, S_low, V_low;
};
// Adds the three gradients to `grads` (OsftOps::factor_grads; everything in the memory of the ops'
// backend).
void osft_add_factor_grads(OsftOps& ops, const OsftFactors& full, const core::Tensor& dW,
                           const OsftLowGrads& grads);
// The three gradients of host factors, as new host tensors.
OsftLowGrads osft_factor_grads(const OsftFactors& full, const core::Tensor& dW);

}  // namespace optim
