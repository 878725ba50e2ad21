// Strided, batched GEMM on the host, templated on the scalar type so the float64 reference
// kernels of the tests run the same code: f32 through oneDNN's matmul (onednn_gemm.h), float64
// through OpenBLAS (cblas_dgemm). blas_gemm is OpenBLAS at both precisions, for the small
// products inside other kernels' tiles (attention, Newton-Schulz). The bf16 GEMM is oneDNN's too;
// core/cpu/gemm.cpp chooses.
//
// oneDNN rather than OpenBLAS for f32: measured with apps/bench_ops (--threads 1 --clock cpu) on
// a Zen 4, oneDNN's f32 matmul ran at 1.4-2.0x OpenBLAS's sgemm at the model shapes under the
// environment's OPENBLAS_CORETYPE=Haswell, and level with or above the Cooperlake kernels
// OpenBLAS picks unpinned; oneDNN picks its kernels by its own CPU dispatch (docs/benchmarks.md,
// "The GEMM kernels"). Eigen's GEMM ran at 0.70-0.96x of OpenBLAS's (D = 256..768). Except on
// CPUs where oneDNN runs its AVX2 kernels: there the weight gradients' layout goes to OpenBLAS
// (f32_trans_a_on_openblas below).
#pragma once

#include <cblas.h>
#include <omp.h>

#include <cstdint>
#include <type_traits>

#include "core/backend.h"
#include "core/cpu/onednn_gemm.h"

namespace core::cpu {

inline void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                      const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                      float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

inline void blas_gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha,
                      const double* a, int64_t lda, const double* b, int64_t ldb, double beta,
                      double* c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

// Whether an f32 GEMM with A transposed and B not, one matrix (the weight gradients, dW = dY^T X)
// runs on OpenBLAS's sgemm rather than oneDNN's matmul: yes where oneDNN's f32 kernels are its
// AVX2 ones (no AVX-512, no AMX), decided once per process. Measured side by side on a Zen 2
// (bench_ops --only gemm, D 128 to 1024, 1 and 2 threads; docs/benchmarks.md, "AVX2 machines"):
// oneDNN's avx2 matmul ran this layout at 0.46-1.03x OpenBLAS's (0.46-0.55 for D 256's MLP
// weight gradients), every other layout at 0.91-1.30x. ENGINE_CPU_TRANS_A_GEMM=onednn or
// openblas overrides the choice (benchmarks, tests of both paths).
inline constexpr const char* kTransAGemmEnv = "ENGINE_CPU_TRANS_A_GEMM";
bool f32_trans_a_on_openblas();

// The empty product (k = 0) of resolved arguments: C = beta C (beta 0 clears, even NaN).
template <typename T>
void scale_gemm_output(const GemmArgs& r, T* c) {
  const T beta = static_cast<T>(r.beta);
  for (int64_t i = 0; i < r.batch; ++i) {
    for (int64_t row = 0; row < r.m; ++row) {
      T* ci = c + i * r.stride_c + row * r.ldc;
      for (int64_t j = 0; j < r.n; ++j)
        ci[j] = beta == T(0) ? T(0) : beta * ci[j];
    }
  }
}

// C_i = alpha op(A_i) op(B_i) + beta C_i for i < batch. In f32, one oneDNN matmul over the
// batch. In float64, a batch at least as large as the thread count runs one single-threaded GEMM
// per thread (OpenBLAS goes single-threaded inside an OpenMP region); otherwise each GEMM uses
// all threads.
template <typename T>
void gemm(const GemmArgs& args, const T* a, const T* b, T* c) {
  GemmArgs r = resolve_gemm_args(args);
  if (r.batch == 0 || r.m == 0 || r.n == 0) return;
  if (r.k == 0) {
    scale_gemm_output(r, c);
  } else if constexpr (std::is_same_v<T, float>) {
    if (r.trans_a && !r.trans_b && r.batch == 1 && f32_trans_a_on_openblas())
      blas_gemm(true, false, r.m, r.n, r.k, r.alpha, a, r.lda, b, r.ldb, r.beta, c, r.ldc);
    else
      onednn_gemm(r, a, b, c);
  } else {
    const T alpha = static_cast<T>(r.alpha), beta = static_cast<T>(r.beta);
    auto one = [&](int64_t i) {
      blas_gemm(r.trans_a, r.trans_b, r.m, r.n, r.k, alpha, a + i * r.stride_a, r.lda,
                b + i * r.stride_b, r.ldb, beta, c + i * r.stride_c, r.ldc);
    };
    if (r.batch > 1 && r.batch >= omp_get_max_threads()) {
#pragma omp parallel for schedule(static)
      for (int64_t i = 0; i < r.batch; ++i)
        one(i);
    } else {
      for (int64_t i = 0; i < r.batch; ++i)
        one(i);
    }
  }
}

// The bf16 GEMM on a CPU without bf16 dot-product instructions (resolved arguments, k > 0):
// both operands widened exactly to f32, then the f32 GEMM above (core/cpu/gemm.cpp).
void gemm_bf16_as_f32(const GemmArgs& resolved, const bf16* a, const bf16* b, float* c);
// The same with a bf16 C (beta 0): the f32 GEMM of the widened operands in blocks of rows
// into a per-call f32 scratch of one block, each block rounded once (round_to_bf16, kmath's
// bits), so no f32 copy of all of C is made.
void gemm_bf16_as_f32(const GemmArgs& resolved, const bf16* a, const bf16* b, bf16* c);

}  // namespace core::cpu
