// cuBLASLt matmuls with an epilogue (the CUDA side of GemmOps::gemm_epilogue, core/ops/gemm.h) on
// one stream: a row-major call of the engine mapped onto the column-major library by swapping the
// operands (as gemm.cu does for cuBLAS), the epilogue attributes set, one algorithm chosen by
// cuBLASLt's heuristic per distinct call shape and kept with its descriptors, and one 32 MiB
// workspace (cudaMalloc'd at the first call: backend bookkeeping bypasses the allocator, so its
// live_bytes() counts tensors only).
//
// The mapping: row-major D [m, n] = op(A) op(B) is column-major D^T [n, m] = op(B)^T op(A)^T, so
// the engine's bias over D's columns is cuBLASLt's bias over D's rows (EPILOGUE_BIAS), aux [m, n]
// at ldc is cuBLASLt's [n, m] at ldc (EPILOGUE_AUX_LD, a multiple of 8), and the sums of op(A)
// over k are cuBLASLt's BGRADB (its B is the engine's A). cuBLASLt stores aux and a bias gradient
// in D's type and reads the bias in D's type: an f32 bias with a bf16 D is asked for
// (BIAS_DATA_TYPE f32) and falls back when refused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "core/ops/gemm.h"

struct CUstream_st;
struct cublasLtContext;

namespace core {

// One call: resolved row-major arguments (batch 1) and device pointers.
struct LtMatmulCall {
  GemmArgs g;
  GemmEpilogue kind = GemmEpilogue::none;
  bool inputs_bf16 = false;
  bool output_bf16 = false;
  const void* a = nullptr;
  const void* b = nullptr;
  const void* c = nullptr;  // C, D's layout and type; D itself when in place
  void* d = nullptr;
  const float* bias = nullptr;  // bias, bias_gelu
  void* aux = nullptr;          // bias_gelu (written), dgelu (read)
  float* bgrad = nullptr;       // bgrad: the sums written (=), [m] f32
};

class CublasLtGemm {
 public:
  // The backend's cuBLASLt handle (not owned) and stream.
  CublasLtGemm(cublasLtContext* handle, CUstream_st* stream);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // Issues the matmul and returns true, or returns false having issued nothing when cuBLASLt has
  // no algorithm for it (type combination, alignment, aux leading dimension): the caller then
  // runs the unfused ops. The answer is kept per call shape.
  bool matmul(const LtMatmulCall& call);

 private:
  struct Plan;
  // transposes, m, n, k, lda, ldb, ldc, kind, dtypes, tf32, C not D (an algorithm may lack
  // out-of-place support: a refusal then stays with those calls), the pointers' alignments
  using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int,
                         bool, bool, bool, bool, uint64_t>;

  Plan* plan(const LtMatmulCall& call);

  cublasLtContext* handle_;
  CUstream_st* stream_;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace core
