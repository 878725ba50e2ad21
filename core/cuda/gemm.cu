// The CUDA backend's GEMM family (core/ops/gemm.h): cuBLAS GEMM (row-major through the column-major
// library by swapping the operands) with f32 or bf16 inputs, f32 accumulation, f32 output (or bf16
// for bf16 inputs), TF32 tensor cores on request; and the bias add and its gradient (a
// fixed-order column sum).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "core/check.h"
#include "core/cuda/cuda_backend.h"
#include "core/cuda/cuda_launch.cuh"
#include "core/cuda/cuda_reduce.cuh"
#include "core/kernel_math.h"

namespace core {

using cuda_detail::add_pack;
using cuda_detail::check_sizes;
using cuda_detail::column_sums;
using cuda_detail::first_index;
using cuda_detail::FloatPack;
using cuda_detail::grid_for;
using cuda_detail::grid_stride;
using cuda_detail::kMaxGridY;
using cuda_detail::kThreads;
using cuda_detail::load_pack;
using cuda_detail::pack_width;
using cuda_detail::store_pack;
using cuda_detail::to_int;

namespace {

// out [N, C] += bias per row: x over columns (W at a time; each thread holds its bias pack),
// y over rows. No per-element division.
template <int W>
__global__ void add_bias_kernel(float* out, const float* bias, int64_t N, int64_t C) {
  for (int64_t c = first_index() * W; c < C; c += grid_stride() * W) {
    const FloatPack<W> b = load_pack<W>(bias + c);
    for (int64_t r = blockIdx.y; r < N; r += gridDim.y) {
      FloatPack<W> o = load_pack<W>(out + r * C + c);
      add_pack(o, b);
      store_pack<W>(out + r * C + c, o);
    }
  }
}

// Values of bias_backward: dout itself.
struct BiasGrad {
  static constexpr int kCount = 1;
  const float* dout;
  __device__ void operator()(int64_t r, int64_t c, int64_t C, float* v) const {
    v[0] = dout[r * C + c];
  }
};

// Values of bias_backward from a bf16 dout (bf16 precision), widened exactly.
struct Bf16BiasGrad {
  static constexpr int kCount = 1;
  const bf16* dout;
  __device__ void operator()(int64_t r, int64_t c, int64_t C, float* v) const {
    v[0] = kmath::float_from_bf16(dout[r * C + c]);
  }
};

}  // namespace

namespace {

// One GEMM of resolved arguments with `type` inputs (f32 or bf16), f32 accumulation
// (`compute`: exact f32, or TF32 tensor cores) and a `c_type` output: f32, or for bf16 inputs
// bf16 (beta 0; cuBLAS rounds each f32 result to the nearest bf16 as it stores it).
void gemm_ex(cublasHandle_t cublas, cudaStream_t stream, const GemmArgs& g, const void* a,
             const void* b, void* c, cudaDataType type, cublasComputeType_t compute,
             cudaDataType c_type = CUDA_R_32F) {
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  const char* op = "gemm";
  int m = to_int(g.m, "m", op), n = to_int(g.n, "n", op), k = to_int(g.k, "k", op);
  int ilda = to_int(g.lda, "lda", op), ildb = to_int(g.ldb, "ldb", op);
  int ildc = to_int(g.ldc, "ldc", op);
  if (k == 0) {  // empty product: C = beta C (beta 0 clears, even NaN), as on the CPU
    const size_t c_size = c_type == CUDA_R_32F ? sizeof(float) : sizeof(bf16);
    for (int64_t i = 0; i < g.batch; ++i) {
      char* ci = static_cast<char*>(c) + i * g.stride_c * c_size;
      if (g.beta == 0.0f) {
        ENGINE_CUDA_CALL(cudaMemset2DAsync(ci, g.ldc * c_size, 0, g.n * c_size, g.m, stream));
      } else {  // in place: C = beta C + 0 C, column-major [n, m] with leading dimension ldc
        const float zero = 0.0f;
        float* cf = reinterpret_cast<float*>(ci);
        ENGINE_CUDA_CALL(cublasSgeam(cublas, CUBLAS_OP_N, CUBLAS_OP_N, n, m, &g.beta, cf, ildc,
                                     &zero, cf, ildc, cf, ildc));
      }
    }
    return;
  }
  cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  // A row-major matrix with leading dimension ld is, read column-major with the same ld, its
  // transpose. So row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: call cuBLAS
  // with the operands swapped (B first), n and m swapped, and the same transpose flags.
  if (type == CUDA_R_32F && compute == CUBLAS_COMPUTE_32F) {  // plain f32: the classic entry
    float* cf = static_cast<float*>(c);
    if (g.batch == 1) {
      ENGINE_CUDA_CALL(cublasSgemm(cublas, op_b, op_a, n, m, k, &g.alpha,
                                   static_cast<const float*>(b), ildb, static_cast<const float*>(a),
                                   ilda, &g.beta, cf, ildc));
    } else {
      ENGINE_CUDA_CALL(cublasSgemmStridedBatched(
          cublas, op_b, op_a, n, m, k, &g.alpha, static_cast<const float*>(b), ildb, g.stride_b,
          static_cast<const float*>(a), ilda, g.stride_a, &g.beta, cf, ildc, g.stride_c,
          to_int(g.batch, "batch", op)));
    }
  } else if (g.batch == 1) {
    ENGINE_CUDA_CALL(cublasGemmEx(cublas, op_b, op_a, n, m, k, &g.alpha, b, type, ildb, a, type,
                                  ilda, &g.beta, c, c_type, ildc, compute, CUBLAS_GEMM_DEFAULT));
  } else {
    ENGINE_CUDA_CALL(
        cublasGemmStridedBatchedEx(cublas, op_b, op_a, n, m, k, &g.alpha, b, type, ildb, g.stride_b,
                                   a, type, ilda, g.stride_a, &g.beta, c, c_type, ildc, g.stride_c,
                                   to_int(g.batch, "batch", op), compute, CUBLAS_GEMM_DEFAULT));
  }
}

}  // namespace

void CudaBackend::gemm(const GemmArgs& args, const float* a, const float* b, float* c) {
  const GemmArgs g = resolve_gemm_args(args);
  gemm_ex(cublas_, stream_, g, a, b, c, CUDA_R_32F,
          g.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F);
}

void CudaBackend::gemm(const GemmArgs& args, const bf16* a, const bf16* b, float* c) {
  gemm_ex(cublas_, stream_, resolve_gemm_args(args), a, b, c, CUDA_R_16BF, CUBLAS_COMPUTE_32F);
}

void CudaBackend::gemm(const GemmArgs& args, const bf16* a, const bf16* b, bf16* c) {
  const GemmArgs g = resolve_gemm_args(args);
  ENGINE_CHECK(g.beta == 0.0f,
               name_ + ": gemm with a bf16 C: beta must be 0 (C is written, not read)");
  gemm_ex(cublas_, stream_, g, a, b, c, CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUDA_R_16BF);
}

// bf16 and TF32 tensor-core GEMMs arrived with Ampere (sm_80); earlier devices run them (bf16)
// or ignore them (TF32) at the f32 rate.
std::string CudaBackend::bf16_gemm_slow_reason() const {
  if (compute_capability_ >= 80) return "";
  return name_ + " (sm_" + std::to_string(compute_capability_) +
         ") has no bf16 tensor cores (sm_80 and later have)";
}

std::string CudaBackend::tf32_gemm_slow_reason() const {
  if (compute_capability_ >= 80) return "";
  return name_ + " (sm_" + std::to_string(compute_capability_) +
         ") has no TF32 tensor cores (sm_80 and later have)";
}

void CudaBackend::add_bias(float* out, const float* bias, int64_t N, int64_t C) {
  check_sizes(name_ + ": add_bias", {N, C});
  if (N * C == 0) return;
  const int w = pack_width(C, {out, bias});
  const dim3 grid(grid_for(C / w), static_cast<unsigned>(std::min<int64_t>(N, kMaxGridY)));
  if (w == 4) {
    add_bias_kernel<4><<<grid, kThreads, 0, stream_>>>(out, bias, N, C);
  } else {
    add_bias_kernel<1><<<grid, kThreads, 0, stream_>>>(out, bias, N, C);
  }
  ENGINE_CUDA_LAUNCHED();
}

void CudaBackend::bias_backward(float* dbias, const float* dout, int64_t N, int64_t C) {
  check_sizes(name_ + ": bias_backward", {N, C});
  column_sums(allocator_, stream_, {{dbias, nullptr}}, BiasGrad{dout}, N, C, "bias_backward");
}

void CudaBackend::bias_backward(float* dbias, const bf16* dout, int64_t N, int64_t C) {
  check_sizes(name_ + ": bias_backward", {N, C});
  column_sums(allocator_, stream_, {{dbias, nullptr}}, Bf16BiasGrad{dout}, N, C, "bias_backward");
}

}  // namespace core
