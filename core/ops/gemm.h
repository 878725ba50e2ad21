// Op family: GEMM on the backend's libraries (OpenBLAS and oneDNN, cuBLAS) and the bias forms of
// a linear layer. A part of the Backend interface (core/backend.h: the conventions for pointers,
// shapes and accumulation); implemented per device in core/cpu/gemm.cpp and core/cuda/gemm.cu.
//
// The dtype contract (docs/precision.md): A and B are both f32 or both bf16; the products are
// accumulated in f32 and C is f32 either way. bf16 products are exact in f32, so a bf16 GEMM
// equals the f32 GEMM of the bf16 values up to the order of the f32 additions. An f32 GEMM may
// ask for TF32 tensor cores (GemmArgs::tf32; CUDA only, the CPU computes f32).
#pragma once

#include <cstdint>
#include <string>

#include "core/device.h"

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

class GemmOps {
 public:
  virtual ~GemmOps() = default;

  virtual void gemm(const GemmArgs& args, const float* a, const float* b, float* c) = 0;
  // bf16 inputs, f32 accumulation and output; the same arguments (args.tf32 is ignored).
  virtual void gemm(const GemmArgs& args, const bf16* a, const bf16* b, float* c) = 0;
  // D = epilogue(alpha op(A) op(B) + beta C) for one matrix (batch 1), D [m, n] at ldc. aux [m, n]
  // at ldc has D's dtype (cuBLASLt's rule): bias_gelu writes the pre-activation there, dgelu
  // reads it; null for the other kinds. The inputs as in gemm (f32, with args.tf32, or bf16).
  virtual void gemm_epilogue(const GemmArgs& args, const GemmEpilogueArgs& ep, const float* a,
                             const float* b, float* d, float* aux) = 0;
  virtual void gemm_epilogue(const GemmArgs& args, const GemmEpilogueArgs& ep, const bf16* a,
                             const bf16* b, float* d, float* aux) = 0;
  // D and aux stored in bf16, each the f32 value rounded once (dgelu widens aux exactly); beta 0,
  // no bgrad.
  virtual void gemm_epilogue(const GemmArgs& args, const GemmEpilogueArgs& ep, const bf16* a,
                             const bf16* b, bf16* d, bf16* aux) = 0;
  // Why bf16 GEMMs (TF32 GEMMs) would not run faster than f32 GEMMs on this device, in one line;
  // empty when they do. The bf16 GEMM above works everywhere; this tells a caller whether
  // asking for it pays (engine/precision.h falls back to fp32 and says so when it does not).
  virtual std::string bf16_gemm_slow_reason() const = 0;
  virtual std::string tf32_gemm_slow_reason() const = 0;
  // out[N, C] += bias[C] broadcast over rows; dbias[C] += column sums of dout[N, C].
  virtual void add_bias(float* out, const float* bias, int64_t N, int64_t C) = 0;
  virtual void bias_backward(float* dbias, const float* dout, int64_t N, int64_t C) = 0;
  // From a bf16 dout (bf16 precision's stored output gradient), widened exactly, summed in f32.
  virtual void bias_backward(float* dbias, const bf16* dout, int64_t N, int64_t C) = 0;
};

}  // namespace core
