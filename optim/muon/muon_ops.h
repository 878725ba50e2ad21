// Muon's own device ops: the Newton-Schulz orthogonalisation (built from GEMM), NorMuon's
// normalisation and the cautious parameter update. Element math in muon_math.h, shared by the
// cpu/ and cuda/ implementations; make_muon_ops picks one from the backend's device. Pointers are
// in that backend's memory.
#pragma once

#include <cstdint>
#include <memory>

#include "core/backend.h"
#include "optim/muon/muon_math.h"
#include "optim/muon/newton_schulz.h"

namespace optim {

class MuonOps {
 public:
  virtual ~MuonOps() = default;
  // Orthogonalise x [batch, m, n] in place with the schedule (works on the wide side: a tall
  // matrix is transposed first). Built from GEMM, so it runs at the GEMM rate.
  virtual void newton_schulz(float* x, int64_t m, int64_t n, const NewtonSchulzSchedule& schedule,
                             int64_t batch = 1) = 0;
  // NorMuon normalisation, in place, of `count` matrices u [count, rows, cols] with their second
  // moments s [count, max(rows, cols)] (one per row when rows >= cols, else one per column),
  // updated with beta2 (kmath::normuon_*).
  virtual void normuon_normalize(float* u, float* second_moment, int64_t count, int64_t rows,
                                 int64_t cols, double beta2) = 0;
  // w <- w - lr (wd [u w >= 0] w + u) over n elements (kmath::cautious_update_element).
  virtual void cautious_update(float* w, const float* u, int64_t n, double lr, double wd) = 0;
};

// The ops for `backend`'s device; they run in its stream order and use its memory.
std::unique_ptr<MuonOps> make_muon_ops(core::Backend& backend);

// The implementations make_muon_ops chooses from (cpu/muon_ops.cpp, cuda/muon_ops.cu).
std::unique_ptr<MuonOps> make_cpu_muon_ops(core::Backend& backend);
std::unique_ptr<MuonOps> make_cuda_muon_ops(core::Backend& backend);

}  // namespace optim
