// Linear algebra shared by the SOAP family (SOAP, StackedSoap, REKLS, TpRekls): products of
// row-major f32 matrices through the backend's GEMM, and the eigenbasis refresh of Kronecker
// factors run as one batched phase.
//
// A factor K [n, n] has a basis Q [n, n] (columns = eigenvectors) and eigenvalues lam [n], both
// in descending order of lam (soap_ops.h: FactorRefresh). A refresh replaces them either by the
// symmetric eigendecomposition of K, or by QR power iteration from the previous basis
// (Q <- qr(K Q).Q, power_iter_steps times), optionally followed by sorting the columns by their
// Rayleigh quotients q^T K q.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "core/backend.h"
#include "core/tensor.h"
#include "optim/soap/soap_ops.h"

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

// lam[j] = q_j^T K q_j for the columns q_j of q [n, n] (accumulated in double); returns the
// product K q [n, n] they are formed from.
core::Tensor rayleigh_quotients(core::Backend& backend, const float* k, const float* q, float* lam,
                                int64_t n);
// Sorts lam [n] in descending order (stable, so ties keep their order) and the columns of
// q [n, n] with it; order [n] gets the permutation (new column j is old column order[j]).
void sort_descending(core::Backend& backend, float* q, float* lam, int64_t n, int32_t* order);

// One factor's refresh through the backend's ops, one call each: eigh (the solver's ascending
// output reversed to descending), or power_iter_steps rounds of Q <- qr(K Q).Q (a qr_many task
// with K as its left factor; R's diagonal non-negative) followed, with sort_after, by the
// Rayleigh quotients and the sort. With sort_before_order the previous basis is sorted first by
// the Rayleigh quotients of P = K Q, and the first round factors P's sorted columns, which are
// K times the sorted basis: one K Q product per refresh instead of two.
// `times` (may be null) gets its solver and sort phases, timed on the calling thread (the CPU
// runs it inside a parallel region, one factor per thread).
void refresh_factor(core::Backend& backend, const FactorRefresh& job, int power_iter_steps,
                    SoapPhaseTimes* times);
// The same for a list as batched calls: one eigh_many for every eigendecomposition, each
// power-iteration round as one qr_many, then each sort (the CUDA ops' batched refresh). `times`
// gets the solver and sort phases.
void refresh_factors_batched(core::Backend& backend, std::span<const FactorRefresh> jobs,
                             int power_iter_steps, SoapPhaseTimes* times);

// Collects the refreshes of one optimizer step and runs them together (SoapOps::refresh),
// batched or one factor at a time. With `distribute` (every rank holding the same factors),
// eigendecomposition i runs only on rank i % size, which broadcasts the basis and eigenvalues to
// the others; the communicator must move buffers of the backend's device.
class RefreshBatch {
 public:
  void add(const FactorRefresh& refresh) { jobs_.push_back(refresh); }
  void run(core::Backend& backend, SoapOps& ops, int power_iter_steps, bool batched,
           comm::Communicator* distribute = nullptr, SoapPhaseTimes* times = nullptr);

 private:
  std::vector<FactorRefresh> jobs_;
};

}  // namespace optim
