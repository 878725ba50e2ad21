// Linear algebra shared by the SOAP family (SOAP, StackedSoap, REKLS, TpRekls): products of
// row-major f32 matrices through the backend's GEMM, and the eigenbasis refresh of Kronecker
// factors run as one batched phase.
//
// A factor K [n, n] has a basis Q [n, n] (columns = eigenvectors) and eigenvalues lam [n], both
// in descending order of lam. A refresh replaces them either by the symmetric eigendecomposition
// of K, or by QR power iteration from the previous basis (Q <- qr(K Q).Q, power_iter_steps
// times), optionally followed by sorting the columns by their Rayleigh quotients q^T K q.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "engine/core/backend.h"
#include "engine/core/tensor.h"

namespace optim {

// c [m, n] = alpha op(a) op(b) + beta c, op(a) [m, k], op(b) [k, n], packed row-major.
void matmul(core::Backend& backend, const float* a, bool trans_a, const float* b, bool trans_b,
            float* c, int64_t m, int64_t n, int64_t k, float alpha = 1.0f, float beta = 0.0f);

// lam[j] = q_j^T K q_j for the columns q_j of q [n, n] (accumulated in double).
void rayleigh_quotients(core::Backend& backend, const float* k, const float* q, float* lam,
                        int64_t n);
// Indices that sort lam in descending order (stable, so ties keep their order).
std::vector<int64_t> descending_order(const float* lam, int64_t n);
// Reorders the columns of a [rows, cols] so that new column j is old column order[j].
void permute_columns(float* a, int64_t rows, int64_t cols, const std::vector<int64_t>& order);
// Reorders the rows of a [rows, cols] so that new row i is old row order[i].
void permute_rows(float* a, int64_t rows, int64_t cols, const std::vector<int64_t>& order);

// One factor's refresh: writes the new basis and eigenvalues in place.
struct FactorRefresh {
  const float* k = nullptr;  // [n, n]
  float* q = nullptr;        // [n, n], the previous basis on entry (QR path)
  float* lam = nullptr;      // [n]
  int64_t n = 0;
  bool eigh = false;        // eigendecomposition, else QR power iteration from q
  bool sort_after = false;  // QR path: sort columns by Rayleigh quotients afterwards, set lam
};

// Collects the refreshes of one optimizer step and runs them together: every eigendecomposition
// in one Backend::eigh_many call; each power-iteration round as the K Q products of all QR-path
// factors followed by one Backend::qr_many call. Unbatched, the same operations run one solver
// call per factor; the results are bit for bit the same. With `distribute` (every rank holding
// the same factors), eigendecomposition i runs only on rank i % size, which broadcasts the basis
// and eigenvalues to the others.
class RefreshBatch {
 public:
  void add(const FactorRefresh& refresh) { jobs_.push_back(refresh); }
  void run(core::Backend& backend, int power_iter_steps, bool batched,
           comm::Communicator* distribute = nullptr);

 private:
  std::vector<FactorRefresh> jobs_;
};

}  // namespace optim
