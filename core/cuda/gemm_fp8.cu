// The CUDA backend's FP8 GEMM (core/ops/gemm.h): the encode kernels (kmath::fp8_from_float, the
// CPU's rounding), and gemm_fp8 on cuBLASLt's FP8 kernels where the device has FP8 tensor cores
// (sm_89+), else (or with ENGINE_CUDA_FP8_GEMM=tf32) as the TF32 GEMM of the decoded values:
// FP8 values and their products are exact in TF32 and f32, so both accumulate the same products
// in f32.
//
// cuBLASLt's FP8 kernels on sm_89/sm_90 take only the "TN" form: in its column-major terms op(A)
// = T, op(B) = N, i.e. both operands stored with K contiguous. In the row-major terms of GemmArgs
// that is A stored [m, k] (trans_a false) and B stored [n, k] (trans_b true); an operand stored
// the other way is transposed into scratch bytes first (as train_gpt.py's mm_backward_op does
// with .T.contiguous()). The kernels also want 16-byte aligned pointers, leading dimensions of A
// and B that are multiples of 16 elements, and k and n multiples of 16 (what torch._scaled_mm
// checks); a call that misses one runs the TF32 form.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "core/check.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_launch.cuh"
#include "core/kernel_math.h"

namespace core {

using cuda_detail::DeviceBuffer;
using cuda_detail::first_index;
using cuda_detail::grid_for;
using cuda_detail::grid_stride;
using cuda_detail::kThreads;
using cuda_detail::to_int;

namespace {

__global__ void fp8_encode_kernel(fp8* out, const float* in, int64_t n, float scale,
                                  kmath::Fp8 format) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    out[i] = kmath::fp8_from_float(in[i] / scale, format);
}

__global__ void fp8_encode_bf16_kernel(fp8* out, const bf16* in, int64_t n, float scale,
                                       kmath::Fp8 format) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    out[i] = kmath::fp8_from_float(kmath::float_from_bf16(in[i]) / scale, format);
}

// The scale read from the device by every thread (a dynamic or delayed scale).
__global__ void fp8_encode_scaled_kernel(fp8* out, const float* in, int64_t n, const float* scale,
                                         kmath::Fp8 format) {
  const float s = *scale;
  for (int64_t i = first_index(); i < n; i += grid_stride())
    out[i] = kmath::fp8_from_float(in[i] / s, format);
}

__global__ void fp8_encode_scaled_bf16_kernel(fp8* out, const bf16* in, int64_t n,
                                              const float* scale, kmath::Fp8 format) {
  const float s = *scale;
  for (int64_t i = first_index(); i < n; i += grid_stride())
    out[i] = kmath::fp8_from_float(kmath::float_from_bf16(in[i]) / s, format);
}

__global__ void fp8_scale_from_amax_kernel(float* scale, const float* amax, int64_t n,
                                           float factor) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    scale[i] = kmath::fp8_scale_from_amax(amax[i], factor);
}

__global__ void fp8_decode_kernel(float* out, const fp8* in, int64_t n, kmath::Fp8 format) {
  for (int64_t i = first_index(); i < n; i += grid_stride())
    out[i] = kmath::float_from_fp8(in[i], format);
}

// out [cols, rows] (leading dimension ld_out) = the transpose of in [rows, cols] (leading
// dimension ld_in), in 32 x 32 tiles through shared memory so that both the reads and the writes
// run along rows; blocks of 32 x 8 threads, grid-stride over the tiles.
constexpr int kTile = 32, kTileRows = 8;
__global__ void transpose_bytes_kernel(fp8* out, int64_t ld_out, const fp8* in, int64_t ld_in,
                                       int64_t rows, int64_t cols) {
  __shared__ uint8_t tile[kTile][kTile + 1];
  const int64_t tiles_r = (rows + kTile - 1) / kTile, tiles_c = (cols + kTile - 1) / kTile;
  for (int64_t t = blockIdx.x; t < tiles_r * tiles_c; t += gridDim.x) {
    const int64_t r0 = (t / tiles_c) * kTile, c0 = (t % tiles_c) * kTile;
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t r = r0 + i, c = c0 + threadIdx.x;
      if (r < rows && c < cols) tile[i][threadIdx.x] = in[r * ld_in + c].bits;
    }
    __syncthreads();
    for (int i = threadIdx.y; i < kTile; i += kTileRows) {
      const int64_t c = c0 + i, r = r0 + threadIdx.x;  // out row c, column r
      if (r < rows && c < cols) out[c * ld_out + r] = fp8{tile[threadIdx.x][i]};
    }
    __syncthreads();
  }
}

void transpose_bytes(fp8* out, const fp8* in, int64_t ld_in, int64_t rows, int64_t cols,
                     cudaStream_t stream) {
  const int64_t tiles = ((rows + kTile - 1) / kTile) * ((cols + kTile - 1) / kTile);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(tiles, 65535));
  transpose_bytes_kernel<<<blocks, dim3(kTile, kTileRows), 0, stream>>>(out, rows, in, ld_in, rows,
                                                                        cols);
  ENGINE_CUDA_LAUNCHED();
}

cudaDataType fp8_type(kmath::Fp8 format) {
  return format == kmath::Fp8::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// The largest power of two up to 256 that divides the address: what cuBLASLt's heuristic may
// assume of a pointer (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES, default 256; an algorithm
// picked under the default may need 256-byte aligned operands that an offset pointer is not).
uint32_t alignment_bytes(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  return address % 256 == 0 ? 256u : static_cast<uint32_t>(address & (~address + 1));
}

// The descriptors of one cuBLASLt call, destroyed with it.
struct LtCall {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~LtCall() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (c) cublasLtMatrixLayoutDestroy(c);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// cuBLASLt's workspace: what NVIDIA recommends for Hopper.
constexpr size_t kLtWorkspace = size_t{32} << 20;

// Row-major C [m, n] = alpha A [m, k] B [n, k]^T + beta C with K-contiguous FP8 operands (lda,
// ldb) is column-major C^T [n, m] = alpha op_T(B) op_N(A) + beta C^T: cuBLASLt's A is our B
// (transposed), its B our A. scale_a and scale_b (device floats, or null for none) are the
// operands' scales (CUBLASLT_MATMUL_DESC_{A,B}_SCALE_POINTER, swapped likewise). Returns false,
// issuing nothing, when cuBLASLt offers or runs no kernel.
bool lt_matmul(cublasLtHandle_t lt, cudaStream_t stream, Allocator& allocator, const GemmArgs& g,
               const fp8* a, kmath::Fp8 a_format, const float* scale_a, const fp8* b,
               kmath::Fp8 b_format, const float* scale_b, float* c) {
  const char* name = "gemm_fp8";
  const int m = to_int(g.m, "m", name), n = to_int(g.n, "n", name), k = to_int(g.k, "k", name);
  LtCall call;
  ENGINE_CUDA_CALL(cublasLtMatmulDescCreate(&call.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  ENGINE_CUDA_CALL(
      cublasLtMatmulDescSetAttribute(call.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
  ENGINE_CUDA_CALL(
      cublasLtMatmulDescSetAttribute(call.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
  const int8_t fast_accum = g.fp8_fast_accum ? 1 : 0;
  ENGINE_CUDA_CALL(cublasLtMatmulDescSetAttribute(call.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM,
                                                  &fast_accum, sizeof(fast_accum)));
  if (scale_b)
    ENGINE_CUDA_CALL(cublasLtMatmulDescSetAttribute(call.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                    &scale_b, sizeof(scale_b)));
  if (scale_a)
    ENGINE_CUDA_CALL(cublasLtMatmulDescSetAttribute(call.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                    &scale_a, sizeof(scale_a)));
  ENGINE_CUDA_CALL(cublasLtMatrixLayoutCreate(&call.a, fp8_type(b_format), k, n, g.ldb));
  ENGINE_CUDA_CALL(cublasLtMatrixLayoutCreate(&call.b, fp8_type(a_format), k, m, g.lda));
  ENGINE_CUDA_CALL(cublasLtMatrixLayoutCreate(&call.c, CUDA_R_32F, n, m, g.ldc));
  ENGINE_CUDA_CALL(cublasLtMatmulPreferenceCreate(&call.pref));
  const size_t workspace_bytes = kLtWorkspace;
  ENGINE_CUDA_CALL(cublasLtMatmulPreferenceSetAttribute(call.pref,
                                                        CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                        &workspace_bytes, sizeof(workspace_bytes)));
  const uint32_t align_a = alignment_bytes(b), align_b = alignment_bytes(a),
                 align_c = alignment_bytes(c);  // cuBLASLt's A is our B (see above)
  for (auto [attribute, align] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a},
                                  std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b},
                                  std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c},
                                  std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c}})
    ENGINE_CUDA_CALL(
        cublasLtMatmulPreferenceSetAttribute(call.pref, attribute, &align, sizeof(align)));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      lt, call.op, call.a, call.b, call.c, call.c, call.pref, 1, &heuristic, &found);
  if (status != CUBLAS_STATUS_SUCCESS || found == 0) return false;
  DeviceBuffer<uint8_t> workspace(allocator, static_cast<int64_t>(workspace_bytes));
  const cublasStatus_t run =
      cublasLtMatmul(lt, call.op, &g.alpha, b, call.a, a, call.b, &g.beta, c, call.c, c, call.c,
                     &heuristic.algo, workspace.get(), workspace_bytes, stream);
  // Refused before anything ran (as cublaslt_gemm.cu treats it): the caller runs the TF32 form.
  if (run == CUBLAS_STATUS_NOT_SUPPORTED || run == CUBLAS_STATUS_INVALID_VALUE) return false;
  ENGINE_CUDA_CALL(run);
  return true;
}

// ENGINE_CUDA_FP8_GEMM=tf32: every gemm_fp8 as the TF32 GEMM of the decoded values (the FP8
// head's path before cuBLASLt, kept for timing it side by side and as the fallback).
bool fp8_gemm_forced_tf32() {
  const char* env = std::getenv("ENGINE_CUDA_FP8_GEMM");
  if (env == nullptr || *env == '\0') return false;
  ENGINE_CHECK(std::strcmp(env, "tf32") == 0,
               std::string("ENGINE_CUDA_FP8_GEMM=") + env + ": expected tf32 or unset");
  return true;
}

}  // namespace

void CudaBackend::fp8_encode(fp8* out, const float* in, int64_t n, float scale, kmath::Fp8 format) {
  if (n <= 0) return;
  fp8_encode_kernel<<<grid_for(n), kThreads, 0, stream_>>>(out, in, n, scale, format);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::fp8_encode(fp8* out, const bf16* in, int64_t n, float scale, kmath::Fp8 format) {
  if (n <= 0) return;
  fp8_encode_bf16_kernel<<<grid_for(n), kThreads, 0, stream_>>>(out, in, n, scale, format);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::fp8_encode_scaled(fp8* out, const float* in, int64_t n, const float* scale,
                                    kmath::Fp8 format) {
  if (n <= 0) return;
  fp8_encode_scaled_kernel<<<grid_for(n), kThreads, 0, stream_>>>(out, in, n, scale, format);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::fp8_encode_scaled(fp8* out, const bf16* in, int64_t n, const float* scale,
                                    kmath::Fp8 format) {
  if (n <= 0) return;
  fp8_encode_scaled_bf16_kernel<<<grid_for(n), kThreads, 0, stream_>>>(out, in, n, scale, format);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::fp8_scale_from_amax(float* scale, const float* amax, int64_t n, float factor) {
  if (n <= 0) return;
  fp8_scale_from_amax_kernel<<<grid_for(n), kThreads, 0, stream_>>>(scale, amax, n, factor);
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::gemm_fp8(const GemmArgs& args, const fp8* a, kmath::Fp8 a_format, const fp8* b,
                           kmath::Fp8 b_format, float* c) {
  gemm_fp8_scaled(args, a, a_format, nullptr, b, b_format, nullptr, c);
}

// gemm_fp8 is this with no scales (null): the scales go to cuBLASLt as device pointers; the TF32
// form reads them back (one wait) and folds them into alpha.
void CudaBackend::gemm_fp8_scaled(const GemmArgs& args, const fp8* a, kmath::Fp8 a_format,
                                  const float* scale_a, const fp8* b, kmath::Fp8 b_format,
                                  const float* scale_b, float* c) {
  GemmArgs g = resolve_fp8_gemm_args(args, a_format, b_format);
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) {  // the empty product: C = beta C, as gemm does it (the scales multiply 0)
    gemm(g, static_cast<const float*>(nullptr), nullptr, c);
    return;
  }
  const bool forced_tf32 = fp8_gemm_forced_tf32();  // checked on every device
  const bool tensor_cores = !forced_tf32 && fp8_gemm_missing_reason().empty() && g.k % 16 == 0 &&
                            g.n % 16 == 0 && g.ldc % 4 == 0 && aligned16(c);
  if (tensor_cores) {
    // The K-contiguous forms: an operand stored [k, m] or [k, n] transposed into scratch.
    const int64_t a_bytes = g.trans_a ? g.m * g.k : 0, b_bytes = g.trans_b ? 0 : g.n * g.k;
    DeviceBuffer<fp8> a_t(allocator_, a_bytes), b_t(allocator_, b_bytes);
    GemmArgs tn = g;
    const fp8 *a_tn = a, *b_tn = b;
    if (g.trans_a) {
      transpose_bytes(a_t.get(), a, g.lda, g.k, g.m, stream_);
      a_tn = a_t.get(), tn.trans_a = false, tn.lda = g.k;
    }
    if (!g.trans_b) {
      transpose_bytes(b_t.get(), b, g.ldb, g.k, g.n, stream_);
      b_tn = b_t.get(), tn.trans_b = true, tn.ldb = g.k;
    }
    if (tn.lda % 16 == 0 && tn.ldb % 16 == 0 && aligned16(a_tn) && aligned16(b_tn) &&
        lt_matmul(cublaslt_, stream_, allocator_, tn, a_tn, a_format, scale_a, b_tn, b_format,
                  scale_b, c))
      return;
  }
  // The TF32 form: both operands decoded (exactly) into f32 scratch, then cuBLAS's GEMM.
  const int64_t a_span = (g.trans_a ? g.k - 1 : g.m - 1) * g.lda + (g.trans_a ? g.m : g.k);
  const int64_t b_span = (g.trans_b ? g.n - 1 : g.k - 1) * g.ldb + (g.trans_b ? g.k : g.n);
  DeviceBuffer<float> a_f32(allocator_, a_span), b_f32(allocator_, b_span);
  fp8_decode_kernel<<<grid_for(a_span), kThreads, 0, stream_>>>(a_f32.get(), a, a_span, a_format);
  ENGINE_CUDA_LAUNCHED();
  fp8_decode_kernel<<<grid_for(b_span), kThreads, 0, stream_>>>(b_f32.get(), b, b_span, b_format);
  ENGINE_CUDA_LAUNCHED();
  for (const float* scale : {scale_a, scale_b}) {
    if (!scale) continue;
    float host = 0.0f;
    copy_to_host(&host, scale, sizeof(float));
    g.alpha *= host;
  }
  g.tf32 = true;
  gemm(g, a_f32.get(), b_f32.get(), c);
}

std::string CudaBackend::fp8_gemm_missing_reason() const {
  return core::fp8_gemm_missing_reason(name_, compute_capability_);
}

}  // namespace core
