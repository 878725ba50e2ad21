// Muon's own device ops: the Newton-Schulz orthogonalisation (built from GEMM), and NorMuon's
// normalisation with the cautious parameter update for all of a step's parameters at once (on a
// GPU one launch per stage for all of them). Element math in muon_math.h, shared by the cpu/ and
// cuda/ implementations; make_muon_ops picks one from the backend's device. Pointers are in that
// backend's memory.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "core/backend.h"
#include "optim/muon/muon_math.h"
#include "optim/muon/newton_schulz.h"

namespace optim {

// One parameter's update after its orthogonalisation: the update u viewed as [count, rows, cols],
// NorMuon's second moments s [count, max(rows, cols)] (one per row when rows >= cols, else one
// per column; nullptr: no normalisation), and the step of w with lr and wd.
struct MuonUpdate {
  float* w = nullptr;
  float* u = nullptr;
  float* second_moment = nullptr;
  int64_t count = 0, rows = 0, cols = 0;
  double lr = 0, wd = 0;
};

// One orthogonalisation of a step: x [count, rows, cols] in place.
struct NewtonSchulzJob {
  float* x = nullptr;
  int64_t count = 0, rows = 0, cols = 0;
};

class MuonOps {
 public:
  virtual ~MuonOps() = default;
  // Orthogonalise x [batch, m, n] in place with the schedule (works on the wide side: a tall
  // matrix is transposed first). Built from GEMM, so it runs at the GEMM rate.
  virtual void newton_schulz(float* x, int64_t m, int64_t n, const NewtonSchulzSchedule& schedule,
                             int64_t batch = 1) = 0;
  // All of a step's orthogonalisations (the jobs must not overlap). Here one newton_schulz call
  // per job; a device packs the jobs of one shape into one batched call, so a GPT's 48 matrices
  // of two shapes take two rounds of batched GEMMs instead of 48 of small ones.
  virtual void newton_schulz_many(std::span<const NewtonSchulzJob> jobs,
                                  const NewtonSchulzSchedule& schedule);
  // For every parameter: where second_moment is set, NorMuon's normalisation of u in place with
  // its second moments updated with beta2 (kmath::normuon_*); then w <- w - lr (wd [u w >= 0] w +
  // u) (kmath::cautious_update_element). The parameters must not overlap.
  virtual void update(std::span<const MuonUpdate> params, double beta2) = 0;
};

// The ops for `backend`'s device; they run in its stream order and use its memory.
std::unique_ptr<MuonOps> make_muon_ops(core::Backend& backend);

// The implementations make_muon_ops chooses from (cpu/muon_ops.cpp, cuda/muon_ops.cu).
std::unique_ptr<MuonOps> make_cpu_muon_ops(core::Backend& backend);
std::unique_ptr<MuonOps> make_cuda_muon_ops(core::Backend& backend);

}  // namespace optim
