// OSFT's own device ops (docs/specs/osft.md): the per-step products of orthogonal subspace
// fine-tuning. A target W [n, m] is held as U_high diag(S_high) V_high + U_low diag(S_low) V_low
// with U_* [n, k|r], S_* [k|r], V_* [k|r, m] (row-major, packed). Every product is summed in
// float64 and rounded once to float (element math in osft_math.h; the CPU ops form the same
// float64 products with Eigen, so the devices agree up to float64 summation order).
// make_osft_ops picks the cpu/ or cuda/ implementation from the backend's device; pointers are in
// that backend's memory.
#pragma once

#include <cstdint>
#include <memory>

#include "core/backend.h"

namespace optim {

class OsftOps {
 public:
  virtual ~OsftOps() = default;
  // w [n, m] = the dense weight from the factors (overwritten; n may be a block of rows, with
  // u_high and u_low pointing at its first row).
  virtual void reconstruct(float* w, const float* u_high, const float* s_high, const float* v_high,
                           const float* u_low, const float* s_low, const float* v_low, int64_t n,
                           int64_t m, int64_t k, int64_t r) = 0;
  // The chain rule from dw = dL/dW [n, m] to the trained factors, ACCUMULATED (each term rounded
  // to float, then added): du [n, r] += dW V_low^T diag(S_low), ds [r] += the diagonal of
  // U_low^T dW V_low^T, dv [r, m] += diag(S_low) U_low^T dW.
  virtual void factor_grads(float* du, float* ds, float* dv, const float* dw, const float* u_low,
                            const float* s_low, const float* v_low, int64_t n, int64_t m,
                            int64_t r) = 0;
  // The projection of x [n, r] out of the span of U_high, in two halves around the sum over the
  // row shards: coeff [k, r] = U_high^T x over this part's n rows (float64, overwritten), then
  // x -= U_high coeff with the summed coefficients (in place).
  virtual void left_coefficients(double* coeff, const float* u_high, const float* x, int64_t n,
                                 int64_t k, int64_t r) = 0;
  virtual void project_left(float* x, const float* u_high, const double* coeff, int64_t n,
                            int64_t k, int64_t r) = 0;
  // The projection of the rows of x [rows, m] out of the row space of the whole v_high [k, m],
  // in place: x <- x - (x V_high^T) V_high.
  virtual void project_right(float* x, const float* v_high, int64_t rows, int64_t k, int64_t m) = 0;
  // total [count] = the sum of `parts` vectors partial [parts, count], added in part order
  // (the coefficient all-reduce where the partial sums were all-gathered on a device).
  virtual void sum_partials(double* total, const double* partial, int64_t parts, int64_t count) = 0;
};

// The ops for `backend`'s device; they run in its stream order and use its memory.
std::unique_ptr<OsftOps> make_osft_ops(core::Backend& backend);

// The implementations make_osft_ops chooses from (cpu/osft_ops.cpp, cuda/osft_ops.cu).
std::unique_ptr<OsftOps> make_cpu_osft_ops(core::Backend& backend);
std::unique_ptr<OsftOps> make_cuda_osft_ops(core::Backend& backend);

}  // namespace optim
