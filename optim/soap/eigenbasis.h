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
#include "core/backend.h"
#include "core/tensor.h"

namespace optim {

// Every pointer below is in the backend's memory (host memory on the CPU backend, device memory
// on CUDA); every loop is a backend operation, so a refresh runs on either backend.

// c [m, n] = alpha op(a) op(b) + beta c, op(a) [m, k], op(b) [k, n], packed row-major.
void matmul(core::Backend& backend, const float* a, bool trans_a, const float* b, bool trans_b,
            float* c, int64_t m, int64_t n, int64_t k, float alpha = 1.0f, float beta = 0.0f);

// An uninitialised f32 tensor in the backend's memory (the scratch of a SOAP-family step).
core::Tensor backend_tensor(core::Backend& backend, const core::Shape& shape);

// n int32 indices in the backend's memory (an eigenvalue sort's permutation).
class BackendIndices {
 public:
  BackendIndices(core::Backend& backend, int64_t n);
  ~BackendIndices();
  BackendIndices(const BackendIndices&) = delete;
  BackendIndices& operator=(const BackendIndices&) = delete;
  int32_t* get() const { return data_; }

 private:
  core::Allocator& allocator_;
  size_t bytes_;
  int32_t* data_;
};

// lam[j] = q_j^T K q_j for the columns q_j of q [n, n] (accumulated in double).
void rayleigh_quotients(core::Backend& backend, const float* k, const float* q, float* lam,
                        int64_t n);
// Sorts lam [n] in descending order (stable, so ties keep their order) and the columns of
// q [n, n] with it; order [n] gets the permutation (new column j is old column order[j]).
void sort_descending(core::Backend& backend, float* q, float* lam, int64_t n, int32_t* order);

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
// and eigenvalues to the others; the communicator must move buffers of the backend's device.
class RefreshBatch {
 public:
  void add(const FactorRefresh& refresh) { jobs_.push_back(refresh); }
  void run(core::Backend& backend, int power_iter_steps, bool batched,
           comm::Communicator* distribute = nullptr);

 private:
  std::vector<FactorRefresh> jobs_;
};

}  // namespace optim
