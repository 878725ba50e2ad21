// GEMM on the CPU through oneDNN's matmul primitive (Debian libdnnl-dev), the library PyTorch's
// CPU path uses: f32 operands with f32 C (the backend's f32 GEMMs, cpu_gemm.h), and bf16
// operands with f32 accumulation and f32 or bf16 C (on AVX512_BF16 or AMX).
//
// oneDNN for bf16 rather than libxsmm: measured on this machine's model shapes (the forward and
// both backward products of gpt2 and modern at D 256, the classifier included; one thread, CPU
// time, interleaved, under load), oneDNN's bf16 matmul ran at 170-220 GFLOP/s against OpenBLAS
// sgemm's 90-105, and 1.30x faster in total than a blocked GEMM over libxsmm 1.17's bf16
// batch-reduce kernels (libxsmm provides the micro-kernels; packing, blocking and threading are
// the caller's). oneDNN for f32 rather than OpenBLAS: its kernels are chosen by its own CPU
// dispatch, whatever OPENBLAS_CORETYPE pins (docs/benchmarks.md, "The GEMM kernels").
#pragma once

#include <string>

#include "core/device.h"
#include "core/ops/gemm.h"

namespace core::cpu {

// C = alpha op(A) op(B) + beta C for resolved arguments (resolve_gemm_args) with m, n, k and
// batch positive. The primitive for each distinct argument set is made once and kept; calls may
// come from several threads at once. With an f32 C, a k of at least 16384 and 8 times m and n is
// summed in chunks of about 8192, in order (onednn_gemm.cpp: oneDNN's rate at such shapes).
void onednn_gemm(const GemmArgs& resolved, const float* a, const float* b, float* c);
void onednn_gemm(const GemmArgs& resolved, const bf16* a, const bf16* b, float* c);
// The same with C stored in bf16, each f32 result rounded once by oneDNN as it is written;
// beta must be 0.
void onednn_gemm(const GemmArgs& resolved, const bf16* a, const bf16* b, bf16* c);

// The instruction set of the kernels oneDNN runs here, as oneDNN names it ("avx512_core_bf16");
// ONEDNN_MAX_CPU_ISA can cap it.
std::string onednn_isa();

}  // namespace core::cpu
