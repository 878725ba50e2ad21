// resolve_gemm_args and resolve_gemm_epilogue_args (core/ops/gemm.h): the argument checks both
// backends' GEMMs share.
#include <algorithm>
#include <string>

#include "core/check.h"
#include "core/ops/gemm.h"

namespace core {

GemmArgs resolve_gemm_args(const GemmArgs& args) {
  GemmArgs r = args;
  auto fail = [&](const std::string& what) {
    ENGINE_FAIL("gemm(m=" + std::to_string(args.m) + ", n=" + std::to_string(args.n) +
                ", k=" + std::to_string(args.k) + ", trans_a=" + std::to_string(args.trans_a) +
                ", trans_b=" + std::to_string(args.trans_b) + "): " + what);
  };
  if (r.m < 0 || r.n < 0 || r.k < 0 || r.batch < 0) fail("negative size");
  // Stored widths (row-major): A is [m, k] or, transposed, [k, m].
  const int64_t a_cols = r.trans_a ? r.m : r.k;
  const int64_t b_cols = r.trans_b ? r.k : r.n;
  // BLAS and cuBLAS want leading dimensions >= 1 even for empty matrices.
  if (r.lda == 0) r.lda = std::max<int64_t>(1, a_cols);
  if (r.ldb == 0) r.ldb = std::max<int64_t>(1, b_cols);
  if (r.ldc == 0) r.ldc = std::max<int64_t>(1, r.n);
  if (r.lda < a_cols) fail("lda " + std::to_string(r.lda) + " < " + std::to_string(a_cols));
  if (r.ldb < b_cols) fail("ldb " + std::to_string(r.ldb) + " < " + std::to_string(b_cols));
  if (r.ldc < r.n) fail("ldc " + std::to_string(r.ldc) + " < " + std::to_string(r.n));
  // Batch members writing one output would race on a GPU and silently overwrite on the CPU.
  if (r.batch > 1 && r.stride_c == 0 && r.m * r.n > 0) fail("batched output needs stride_c");
  return r;
}

const char* gemm_epilogue_name(GemmEpilogue kind) {
  switch (kind) {
    case GemmEpilogue::none:
      return "none";
    case GemmEpilogue::bias:
      return "bias";
    case GemmEpilogue::bias_gelu:
      return "bias_gelu";
    case GemmEpilogue::dgelu:
      return "dgelu";
    case GemmEpilogue::bgrad:
      return "bgrad";
  }
  return "unknown";
}

GemmArgs resolve_gemm_epilogue_args(const GemmArgs& args, const GemmEpilogueArgs& ep, bool d_bf16,
                                    bool has_aux) {
  const GemmArgs r = resolve_gemm_args(args);
  auto fail = [&](const std::string& what) {
    ENGINE_FAIL(std::string("gemm_epilogue(") + gemm_epilogue_name(ep.kind) +
                ", m=" + std::to_string(r.m) + ", n=" + std::to_string(r.n) +
                ", k=" + std::to_string(r.k) + (d_bf16 ? ", bf16 D" : ", f32 D") + "): " + what);
  };
  const GemmEpilogue kind = ep.kind;
  const bool gelu = kind == GemmEpilogue::bias_gelu || kind == GemmEpilogue::dgelu;
  if (r.batch != 1) fail("batch " + std::to_string(r.batch) + ": one matrix only");
  if ((kind == GemmEpilogue::bias || gelu) && r.ldc != r.n)
    fail("ldc " + std::to_string(r.ldc) + " != n: the epilogue needs a packed D");
  if ((kind == GemmEpilogue::bias || kind == GemmEpilogue::bias_gelu) && !ep.bias) fail("no bias");
  if (gelu != has_aux) fail(gelu ? "no aux (the pre-activation)" : "aux given but not used");
  if (gelu && r.beta != 0.0f) fail("beta must be 0");
  if (kind == GemmEpilogue::bgrad) {
    if (!ep.dbias) fail("no dbias");
    if (!r.trans_a || r.lda != r.m) fail("bgrad sums A stored packed [k, m] (trans_a, lda == m)");
    if (d_bf16) fail("bgrad needs an f32 D");
  }
  if (d_bf16 && ep.c) fail("a bf16 D takes a bf16 C (c_bf16), not an f32 one");
  if (!d_bf16 && ep.c_bf16) fail("a bf16 C (c_bf16) needs a bf16 D");
  return r;
}

GemmArgs resolve_fp8_gemm_args(const GemmArgs& args, kmath::Fp8 a_format, kmath::Fp8 b_format) {
  const GemmArgs r = resolve_gemm_args(args);
  const std::string call = "gemm_fp8(m=" + std::to_string(args.m) +
                           ", n=" + std::to_string(args.n) + ", k=" + std::to_string(args.k) +
                           "): ";
  ENGINE_CHECK(!(a_format == kmath::Fp8::E5M2 && b_format == kmath::Fp8::E5M2),
               call + "e5m2 x e5m2 is not an FP8 GEMM (one operand must be e4m3)");
  ENGINE_CHECK(r.batch == 1, call + "batch " + std::to_string(r.batch) + ", only 1 is supported");
  return r;
}

std::string fp8_gemm_missing_reason(const std::string& device, int compute_capability) {
  if (compute_capability >= 89) return "";
  return device + " has compute capability " + std::to_string(compute_capability / 10) + "." +
         std::to_string(compute_capability % 10) + "; FP8 tensor cores need 8.9 or later";
}

}  // namespace core
