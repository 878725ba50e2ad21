// The SOAP family's own device ops: the Adam step in the eigenbasis, its RMS clip, KL-Shampoo's
// weighting of the eigenbasis columns, and the eigenbasis refresh of a list of factors. With the
// Backend's general ops (gemm, eigh_many, qr_many, the column ops) they make a whole step of SOAP,
// StackedSoap, REKLS and TpRekls device work. Element math in soap_math.h, shared by the cpu/ and
// cuda/ implementations; make_soap_ops picks one from the backend's device. Pointers are in that
// backend's memory.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "core/backend.h"
#include "optim/soap/phase_times.h"
#include "optim/soap/soap_math.h"

namespace optim {

// One factor's eigenbasis refresh: writes the new basis and eigenvalues in place. A factor
// K [n, n] has a basis Q [n, n] (columns = eigenvectors) and eigenvalues lam [n], both in
// descending order of lam.
struct FactorRefresh {
  const float* k = nullptr;  // [n, n]
  float* q = nullptr;        // [n, n], the previous basis on entry (QR path)
  float* lam = nullptr;      // [n]
  int64_t n = 0;
  bool eigh = false;        // eigendecomposition, else QR power iteration from q
  bool sort_after = false;  // QR path: sort columns by Rayleigh quotients afterwards, set lam
  // QR path, the amortized pre-sort instead: sort the previous basis by its Rayleigh quotients
  // (lam <- them, sorted) before iterating; `order` [n] gets the permutation (new column j is
  // old column order[j]) for the caller to permute V with.
  int32_t* sort_before_order = nullptr;
};

class SoapOps {
 public:
  virtual ~SoapOps() = default;
  // Adam in the eigenbasis over n elements: m, v updated from g and the direction written to d
  // (kmath::soap_adam_raw / soap_adam_corrected by step.raw).
  virtual void adam(float* d, float* m, float* v, const float* g, int64_t n,
                    const kmath::SoapAdamStep& step) = 0;
  // d <- d * kmath::soap_rms_clip_scale(sum of d^2, n, max_rms), the sum of squares formed and
  // used on the device (CPU: float64 in index order; CUDA: float64 in a fixed tree order).
  virtual void clip_update_rms(float* d, int64_t n, double max_rms) = 0;
  // out [n, n] = q diag(r), r_j = kmath::kl_inverse_root_weight(lam[j], eps, n): KL-Shampoo's
  // C = Q diag(r^2) Q^T is out out^T.
  virtual void kl_root_weight_columns(float* out, const float* q, const float* lam, int64_t n,
                                      double eps) = 0;
  // Refreshes every factor of `jobs` (eigenbasis.h: refresh_factor says what one refresh
  // computes). Batched, the list is one phase: CPU, the factors spread over the threads, largest
  // first, each refreshed on one thread (single-threaded BLAS and LAPACK); CUDA, each step of the
  // refresh as one batched call for all factors. Not batched, one factor after another. On the
  // CPU both give the same bits, whatever the thread count. `times` (may be null) gets the
  // solver and sort phases.
  virtual void refresh(std::span<const FactorRefresh> jobs, int power_iter_steps, bool batched,
                       SoapPhaseTimes* times) = 0;
};

// The ops for `backend`'s device; they run in its stream order and use its memory.
std::unique_ptr<SoapOps> make_soap_ops(core::Backend& backend);

// The implementations make_soap_ops chooses from (cpu/soap_ops.cpp, cuda/soap_ops.cu).
std::unique_ptr<SoapOps> make_cpu_soap_ops(core::Backend& backend);
std::unique_ptr<SoapOps> make_cuda_soap_ops(core::Backend& backend);

}  // namespace optim
