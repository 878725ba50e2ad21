// Op family: GEMM on the backend's BLAS (OpenBLAS, cuBLAS) and the bias forms of a linear layer.
// A part of the Backend interface (core/backend.h: the conventions for pointers, shapes and
// accumulation); implemented per device in core/cpu/gemm.cpp and core/cuda/gemm.cu.
#pragma once

#include <cstdint>

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
};

// GemmArgs with the packed leading dimensions filled in, after checking that every dimension,
// leading dimension and stride is consistent (errors name the call's sizes). Both backends
// resolve their arguments here, so they accept and refuse the same calls.
GemmArgs resolve_gemm_args(const GemmArgs& args);

class GemmOps {
 public:
  virtual ~GemmOps() = default;

  virtual void gemm(const GemmArgs& args, const float* a, const float* b, float* c) = 0;
  // out[N, C] += bias[C] broadcast over rows; dbias[C] += column sums of dout[N, C].
  virtual void add_bias(float* out, const float* bias, int64_t N, int64_t C) = 0;
  virtual void bias_backward(float* dbias, const float* dout, int64_t N, int64_t C) = 0;
};

}  // namespace core
