#include "core/cuda/cublaslt_gemm.h"

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/check.h"
#include "core/cuda/cuda_check.h"

namespace core {

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLASLt's recommendation for Hopper

// The largest power of two up to 256 dividing p's address (256 for null). cuBLASLt's heuristic
// assumes 256-byte aligned A, B, C and D unless MATMUL_PREF_MIN_ALIGNMENT_*_BYTES says less, and
// takes the bias and aux pointers' alignment from their values: a plan holds for these alignments.
uint32_t alignment(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  if (address == 0) return 256;
  return static_cast<uint32_t>(std::min<uintptr_t>(256, address & (~address + 1)));
}

void set_pref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
              uint32_t value, cublasStatus_t& status) {
  if (status == CUBLAS_STATUS_SUCCESS)
    status = cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value));
}

cublasLtEpilogue_t lt_epilogue(GemmEpilogue kind) {
  switch (kind) {
    case GemmEpilogue::none:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::bias:
      return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::bias_gelu:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::dgelu:
      return CUBLASLT_EPILOGUE_DGELU;
    case GemmEpilogue::bgrad:
      return CUBLASLT_EPILOGUE_BGRADB;  // cuBLASLt's B is the engine's A
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

template <typename T>
void set_desc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  ENGINE_CUDA_CALL(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

bool uses_bias_pointer(GemmEpilogue kind) {
  return kind == GemmEpilogue::bias || kind == GemmEpilogue::bias_gelu ||
         kind == GemmEpilogue::bgrad;
}

bool uses_aux(GemmEpilogue kind) {
  return kind == GemmEpilogue::bias_gelu || kind == GemmEpilogue::dgelu;
}

}  // namespace

struct CublasLtGemm::Plan {
  bool ok = false;
  cublasLtMatmulDesc_t desc = nullptr;
  // cuBLASLt's A (the engine's B), B (the engine's A), and C = D's layout.
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, cd = nullptr;
  cublasLtMatmulAlgo_t algo{};

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (cd) cublasLtMatrixLayoutDestroy(cd);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

CublasLtGemm::CublasLtGemm(cublasLtContext* handle, CUstream_st* stream)
    : handle_(handle), stream_(stream) {}

CublasLtGemm::~CublasLtGemm() {
  plans_.clear();
  if (workspace_) cudaFree(workspace_);
}

CublasLtGemm::Plan* CublasLtGemm::plan(const LtMatmulCall& call) {
  const GemmArgs& g = call.g;
  // Each pointer's alignment, 9 bits apiece: a plan is chosen for them and reused only with them.
  const void* pointers[] = {call.a, call.b, call.c, call.d, call.bias, call.aux, call.bgrad};
  uint64_t alignments = 0;
  bool aligned = true;
  for (const void* p : pointers) {
    alignments = alignments << 9 | alignment(p);
    aligned = aligned && alignment(p) >= 16;
  }
  const Key key{g.trans_a,
                g.trans_b,
                g.m,
                g.n,
                g.k,
                g.lda,
                g.ldb,
                g.ldc,
                static_cast<int>(call.kind),
                call.inputs_bf16,
                call.output_bf16,
                g.tf32 && !call.inputs_bf16,
                call.c != nullptr && call.c != call.d,
                alignments};
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second.get();
  auto plan = std::make_unique<Plan>();
  Plan& p = *plan;
  // cuBLASLt requires AUX_LD to be a multiple of 8; unaligned pointers may have no kernel.
  if (aligned && !(uses_aux(call.kind) && g.ldc % 8 != 0)) {
    if (!workspace_) {
      ENGINE_CUDA_CALL(cudaMalloc(&workspace_, kWorkspaceBytes));
      workspace_bytes_ = kWorkspaceBytes;
    }
    const cublasComputeType_t compute =
        (g.tf32 && !call.inputs_bf16) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const cudaDataType_t in = call.inputs_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const cudaDataType_t out = call.output_bf16 ? CUDA_R_16BF : CUDA_R_32F;
    ENGINE_CUDA_CALL(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F));
    const cublasOperation_t op_lt_a = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_lt_b = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, op_lt_a);
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, op_lt_b);
    set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(call.kind));
    if (uses_bias_pointer(call.kind)) {
      const int32_t bias_type = CUDA_R_32F;
      set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, bias_type);
      const void* bias = call.kind == GemmEpilogue::bgrad ? static_cast<const void*>(call.bgrad)
                                                          : static_cast<const void*>(call.bias);
      set_desc(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    }
    if (uses_aux(call.kind)) {
      set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, call.aux);
      set_desc(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, static_cast<int64_t>(g.ldc));
    }
    // Column-major: the engine's B [k, n] (or [n, k] transposed) is cuBLASLt's A, its A cuBLASLt's
    // B.
    ENGINE_CUDA_CALL(
        cublasLtMatrixLayoutCreate(&p.a, in, g.trans_b ? g.k : g.n, g.trans_b ? g.n : g.k, g.ldb));
    ENGINE_CUDA_CALL(
        cublasLtMatrixLayoutCreate(&p.b, in, g.trans_a ? g.m : g.k, g.trans_a ? g.k : g.m, g.lda));
    ENGINE_CUDA_CALL(cublasLtMatrixLayoutCreate(&p.cd, out, g.n, g.m, g.ldc));
    cublasLtMatmulPreference_t pref = nullptr;
    ENGINE_CUDA_CALL(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t bytes = workspace_bytes_;
    cublasStatus_t set = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof(bytes));
    // A bf16 D is each f32 result rounded once (core/ops/gemm.h): split-K partial sums reduced in
    // f32 (COMPUTE_TYPE), never through D's bf16 (INPLACE, OUTPUT_TYPE; all allowed by default).
    const uint32_t schemes =
        call.output_bf16
            ? uint32_t{CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE}
            : uint32_t{CUBLASLT_REDUCTION_SCHEME_MASK};
    if (set == CUBLAS_STATUS_SUCCESS) {
      set = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                 &schemes, sizeof(schemes));
    }
    // cuBLASLt's A is the engine's B, its B the engine's A; C is D when in place (as matmul
    // passes).
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment(call.b), set);
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment(call.a), set);
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment(call.c ? call.c : call.d),
             set);
    set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment(call.d), set);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status =
        set == CUBLAS_STATUS_SUCCESS
            ? cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.cd, p.cd, pref, 1,
                                             &result, &found)
            : set;
    cublasLtMatmulPreferenceDestroy(pref);
    // NOT_SUPPORTED (or an invalid combination) means no kernel: the caller runs the ops unfused.
    p.ok = status == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    if (p.ok) p.algo = result.algo;
  }
  return plans_.emplace(key, std::move(plan)).first->second.get();
}

bool CublasLtGemm::matmul(const LtMatmulCall& call) {
  const GemmArgs& g = call.g;
  if (g.k == 0) return false;  // the empty product: the unfused path's C = beta C
  Plan* p = plan(call);
  if (!p->ok) return false;
  if (uses_bias_pointer(call.kind)) {
    const void* bias = call.kind == GemmEpilogue::bgrad ? static_cast<const void*>(call.bgrad)
                                                        : static_cast<const void*>(call.bias);
    set_desc(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
  }
  if (uses_aux(call.kind)) set_desc(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, call.aux);
  const float alpha = g.alpha, beta = g.beta;
  const cublasStatus_t status = cublasLtMatmul(
      handle_, p->desc, &alpha, call.b, p->a, call.a, p->b, &beta, call.c ? call.c : call.d, p->cd,
      call.d, p->cd, &p->algo, workspace_, workspace_bytes_, stream_);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) {
    p->ok = false;  // refused before anything ran: from now on this shape runs unfused
    return false;
  }
  ENGINE_CUDA_CALL(status);
  return true;
}

}  // namespace core
