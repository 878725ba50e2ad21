// Op family: GEMM on the backend's libraries (OpenBLAS and oneDNN, cuBLAS) and the bias forms of
// a linear layer. A part of the Backend interface (core/backend.h: the conventions for pointers,
// shapes and accumulation); implemented per device in core/cpu/gemm.cpp and core/cuda/gemm.cu.
//
// The dtype contract (docs/precision.md): A and B are both f32 or both bf16; the products are
// accumulated in f32 and C is f32, or for bf16 inputs also bf16 (each f32 result rounded once;
// beta 0, but for gemm_epilogue's residual add, which reads a bf16 C widened). bf16 products are
// exact in f32, so a bf16 GEMM equals the f32 GEMM of the bf16 values up to the order of the f32
// additions. An f32 GEMM may ask for TF32 tensor cores (GemmArgs::tf32; CUDA only, the CPU computes
// f32).
//
// FP8 (the record's lm_head, docs/record_recipe.md): fp8_encode stores e4m3 or e5m2 bytes of
// in / scale; gemm_fp8 multiplies two byte matrices (e4m3 x e4m3, or one of them e5m2) with f32
// accumulation into f32 C. FP8 products are exact in f32, so gemm_fp8 equals the f32 GEMM of the
// decoded values up to the order of the f32 additions: the CPU decodes and runs exactly that f32
// GEMM; a GPU with FP8 tensor cores (sm_89+) runs cuBLASLt's FP8 kernels.
#pragma once

#include <cstdint>
#include <string>

#include "core/device.h"
#include "core/kernel_math.h"

namespace core {

// C = alpha * op(A) @ op(B) + beta * C for `batch` matrices at fixed strides.
// op(A) is [m, k], op(B) is [k, n], C is [m, n]; leading dimensions default to the packed ones
// (lda = trans_a ? m : k, ldb = trans_b ? k : n, ldc = n) when left at 0.
struct GemmArgs {
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  float beta = 0.0f;  // 1.0f accumulates into C (gradients)
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // elements between batch members
  // f32 inputs only: allow TF32 tensor cores (inputs rounded to 10 mantissa bits, f32
  // accumulation); the CPU has none and computes f32.
  bool tf32 = false;
  // gemm_fp8 only: allow the FP8 tensor cores' fast accumulation (cuBLASLt FAST_ACCUM: partial
  // sums kept in lower precision, as torch._scaled_mm's use_fast_accum); the CPU ignores it.
  bool fp8_fast_accum = false;
};

// What a GEMM does with its f32 result X = alpha op(A) op(B) + beta C before it stores D [m, n]
// (cuBLASLt's epilogues; GemmOps::gemm_epilogue). Each kind is the unfused sequence of the ops
// named, value for value: the GEMM into D, then add_bias, gelu_forward, gelu_backward or
// bias_backward, and the CPU computes exactly that sequence.
enum class GemmEpilogue {
  none,       // D = X
  bias,       // D = X + bias, bias [n] added to every row
  bias_gelu,  // aux = X + bias, D = gelu(aux) (kmath::gelu_tanh); beta 0
  dgelu,      // D = gelu'(aux) X (kmath::gelu_tanh_grad); beta 0
  bgrad,  // D = X, and dbias [m] += the sums of op(A) over k (A stored [k, m], trans_a, packed):
          // in a weight-gradient GEMM dW = dy^T x, the bias gradient of dy
};

struct GemmEpilogueArgs {
  GemmEpilogue kind = GemmEpilogue::none;
  // C when it is not D: D = alpha op(A) op(B) + beta C written fresh (a residual add into a new
  // output), C [m, n] at ldc like D; null: C is D (beta accumulates in place).
  const float* c = nullptr;
  const float* bias = nullptr;  // bias, bias_gelu: [n] f32
  float* dbias = nullptr;       // bgrad: [m] f32, accumulated (+=)
  // C of a bf16 D (kinds none and bias), stored bf16 like D and widened exactly: bf16
  // precision's residual stream, D = round(alpha op(A) op(B) + beta C (+ bias)). Null with beta
  // != 0: C is D (read before it is written). An f32 D takes `c` only.
  const bf16* c_bf16 = nullptr;
};

// The resolved arguments of a gemm_epilogue call after checking what the epilogue needs (one
// matrix, a packed D for bias and GELU kinds, aux, bias or dbias present, beta 0 where the kind
// or a bf16 D needs it); errors name the kind and the sizes. Both backends check here.
GemmArgs resolve_gemm_epilogue_args(const GemmArgs& args, const GemmEpilogueArgs& ep, bool d_bf16,
                                    bool has_aux);
const char* gemm_epilogue_name(GemmEpilogue kind);

// GemmArgs with the packed leading dimensions filled in, after checking that every dimension,
// leading dimension and stride is consistent (errors name the call's sizes). Both backends
// resolve their arguments here, so they accept and refuse the same calls.
GemmArgs resolve_gemm_args(const GemmArgs& args);

// resolve_gemm_args for gemm_fp8, which also refuses e5m2 x e5m2 (no FP8 GEMM library takes it)
// and batches (one matrix product a call).
GemmArgs resolve_fp8_gemm_args(const GemmArgs& args, kmath::Fp8 a_format, kmath::Fp8 b_format);

// Why a GPU of this compute capability (10 * major + minor) has no FP8 tensor cores, in one
// line naming it (`device`) and its capability; empty from sm_89 (Ada, Hopper) on.
std::string fp8_gemm_missing_reason(const std::string& device, int compute_capability);

class GemmOps {
 public:
  virtual ~GemmOps() = default;

  virtual void gemm(const GemmArgs& args, const float* a, const float* b, float* c) = 0;
  // bf16 inputs, f32 accumulation and output; the same arguments (args.tf32 is ignored).
  virtual void gemm(const GemmArgs& args, const bf16* a, const bf16* b, float* c) = 0;
  // bf16 inputs, f32 accumulation, and C written in bf16: each element's f32 result
  // (alpha op(A) op(B)) rounded once to the nearest bf16, ties to even (kmath::bf16_from_float;
  // the CPU's oneDNN path flushes f32 sums below 2^-126 to zero, as its f32 C does).
  // args.beta must be 0: C is written, never read (bf16 precision's logits).
  virtual void gemm(const GemmArgs& args, const bf16* a, const bf16* b, bf16* c) = 0;
  // D = epilogue(alpha op(A) op(B) + beta C) for one matrix (batch 1), D [m, n] at ldc. aux [m, n]
  // at ldc has D's dtype (cuBLASLt's rule): bias_gelu writes the pre-activation there, dgelu
  // reads it; null for the other kinds. The inputs as in gemm (f32, with args.tf32, or bf16).
  virtual void gemm_epilogue(const GemmArgs& args, const GemmEpilogueArgs& ep, const float* a,
                             const float* b, float* d, float* aux) = 0;
  virtual void gemm_epilogue(const GemmArgs& args, const GemmEpilogueArgs& ep, const bf16* a,
                             const bf16* b, float* d, float* aux) = 0;
  // D and aux stored in bf16, each the f32 value rounded once (dgelu widens aux exactly); no
  // bgrad. beta != 0 (kinds none and bias) reads a bf16 C (ep.c_bf16, or D in place) widened
  // exactly: D = round(alpha op(A) op(B) + beta C (+ bias)), the f32 epilogue's value of the
  // widened C rounded once (the residual add of a bf16 residual stream).
  virtual void gemm_epilogue(const GemmArgs& args, const GemmEpilogueArgs& ep, const bf16* a,
                             const bf16* b, bf16* d, bf16* aux) = 0;
  // Why bf16 GEMMs (TF32 GEMMs) would not run faster than f32 GEMMs on this device, in one line;
  // empty when they do. The bf16 GEMM above works everywhere; this tells a caller whether
  // asking for it pays (engine/precision.h falls back to fp32 and says so when it does not).
  virtual std::string bf16_gemm_slow_reason() const = 0;
  virtual std::string tf32_gemm_slow_reason() const = 0;
  // out[i] = the FP8 bits of kmath::fp8_value(in[i] / scale, format), n elements (f32 or bf16
  // input, the bf16 widened exactly first): the operands of a scaled FP8 GEMM.
  virtual void fp8_encode(fp8* out, const float* in, int64_t n, float scale, kmath::Fp8 format) = 0;
  virtual void fp8_encode(fp8* out, const bf16* in, int64_t n, float scale, kmath::Fp8 format) = 0;
  // C = alpha * op(A) @ op(B) + beta * C over FP8 A and B of the given formats (the same
  // arguments as gemm; batch 1; args.tf32 is ignored). Any transposes: where the library wants
  // another layout (cuBLASLt's FP8 kernels take K-contiguous operands only) the backend
  // transposes the bytes into scratch first.
  virtual void gemm_fp8(const GemmArgs& args, const fp8* a, kmath::Fp8 a_format, const fp8* b,
                        kmath::Fp8 b_format, float* c) = 0;
  // The same with the scale a float in this backend's memory (a dynamic or delayed scale that
  // stays on the device): out[i] = the FP8 bits of kmath::fp8_value(in[i] / *scale, format).
  virtual void fp8_encode_scaled(fp8* out, const float* in, int64_t n, const float* scale,
                                 kmath::Fp8 format) = 0;
  virtual void fp8_encode_scaled(fp8* out, const bf16* in, int64_t n, const float* scale,
                                 kmath::Fp8 format) = 0;
  // scale[i] = max(amax[i], 1e-12) * factor for n floats in this backend's memory: an FP8 scale
  // from an amax (abs_max), factor = headroom / 448 for e4m3 (the record's clamp and form).
  virtual void fp8_scale_from_amax(float* scale, const float* amax, int64_t n, float factor) = 0;
  // gemm_fp8 with the operands' scales in this backend's memory, as torch._scaled_mm takes them:
  // C = (alpha (*scale_a) (*scale_b)) op(A) @ op(B) + beta C, the three factors multiplied in f32
  // in that order (CPU; cuBLASLt applies them in its own order: the last bit of the factor).
  virtual void gemm_fp8_scaled(const GemmArgs& args, const fp8* a, kmath::Fp8 a_format,
                               const float* scale_a, const fp8* b, kmath::Fp8 b_format,
                               const float* scale_b, float* c) = 0;
  // Why this device has no FP8 GEMM in hardware, in one line; empty where it has one, and on
  // the CPU, whose FP8 GEMM is the exact software form above (model.head_fp8 is refused on a GPU
  // without FP8: engine/precision.h).
  virtual std::string fp8_gemm_missing_reason() const = 0;
  // out[N, C] += bias[C] broadcast over rows; dbias[C] += column sums of dout[N, C].
  virtual void add_bias(float* out, const float* bias, int64_t N, int64_t C) = 0;
  virtual void bias_backward(float* dbias, const float* dout, int64_t N, int64_t C) = 0;
  // From a bf16 dout (bf16 precision's stored output gradient), widened exactly, summed in f32.
  virtual void bias_backward(float* dbias, const bf16* dout, int64_t N, int64_t C) = 0;
};

}  // namespace core
