// The CPU backend's gemm family (core/ops/gemm.h). f32 GEMM through oneDNN (cpu_gemm.h); bf16
// GEMM through oneDNN (onednn_gemm.h) on a CPU with bf16 dot-product instructions
// (cpu_isa.h), else as the f32 GEMM of the bf16 values (the same products, in the f32 GEMM's
// order); the FP8 encode and GEMM (the bytes decoded exactly, then the f32 GEMM); the bias add
// and its gradient.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/cpu/bf16_rounding.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/cpu_gemm.h"
#include "core/cpu/cpu_isa.h"
#include "core/cpu/gemm_kernels.h"
#include "core/cpu/onednn_gemm.h"
#include "core/cpu/parallel_loops.h"
#include "core/kernel_math.h"

namespace core {

namespace {

// Elements from the first to the last one a GEMM operand reads: `batch` matrices `stride`
// apart, each `rows` stored rows of `cols` at leading dimension ld.
int64_t operand_span(int64_t batch, int64_t stride, int64_t rows, int64_t cols, int64_t ld) {
  return (batch - 1) * stride + (rows - 1) * ld + cols;
}

// A and B widened exactly to f32 (every element of their strided spans), A first.
std::vector<float> widen_operands(const GemmArgs& r, const bf16* a, const bf16* b) {
  const int64_t a_span =
      operand_span(r.batch, r.stride_a, r.trans_a ? r.k : r.m, r.trans_a ? r.m : r.k, r.lda);
  const int64_t b_span =
      operand_span(r.batch, r.stride_b, r.trans_b ? r.n : r.k, r.trans_b ? r.k : r.n, r.ldb);
  std::vector<float> wide(static_cast<size_t>(a_span + b_span));
  float* wa = wide.data();
  float* wb = wide.data() + a_span;
  cpu::elementwise<float>(a_span, [=](int64_t i) { wa[i] = kmath::float_from_bf16(a[i]); });
  cpu::elementwise<float>(b_span, [=](int64_t i) { wb[i] = kmath::float_from_bf16(b[i]); });
  return wide;
}

int64_t a_span_of(const GemmArgs& r) {
  return operand_span(r.batch, r.stride_a, r.trans_a ? r.k : r.m, r.trans_a ? r.m : r.k, r.lda);
}

// Rows of C one f32 block of the bf16-output fallback holds.
constexpr int64_t kRoundedRows = 32;

}  // namespace

bool cpu::f32_trans_a_on_openblas() {
  static const bool on_openblas = [] {
    if (const char* env = std::getenv(kTransAGemmEnv); env != nullptr && *env != '\0') {
      const std::string choice = env;
      ENGINE_CHECK(choice == "onednn" || choice == "openblas", std::string(kTransAGemmEnv) + "=" +
                                                                   shown_env_value(choice) +
                                                                   ": must be onednn or openblas");
      return choice == "openblas";
    }
    const std::string isa = onednn_isa();
    return isa == "avx2" || isa == "avx2_vnni" || isa == "avx" || isa == "sse41";
  }();
  return on_openblas;
}

void cpu::gemm_bf16_as_f32(const GemmArgs& r, const bf16* a, const bf16* b, float* c) {
  const std::vector<float> wide = widen_operands(r, a, b);
  cpu::gemm(r, wide.data(), wide.data() + a_span_of(r), c);
}

void cpu::gemm_bf16_as_f32(const GemmArgs& r, const bf16* a, const bf16* b, bf16* c) {
  ENGINE_CHECK(r.beta == 0.0f, "gemm with a bf16 C: beta must be 0 (C is written, not read)");
  const std::vector<float> wide = widen_operands(r, a, b);
  const float* wa = wide.data();
  const float* wb = wide.data() + a_span_of(r);
  std::vector<float> block(static_cast<size_t>(std::min(r.m, kRoundedRows) * r.n));
  for (int64_t p = 0; p < r.batch; ++p) {
    for (int64_t i0 = 0; i0 < r.m; i0 += kRoundedRows) {
      // Rows i0.. of op(A): rows of A, or (transposed) columns of it.
      GemmArgs part = r;
      part.m = std::min(kRoundedRows, r.m - i0);
      part.ldc = r.n;
      part.batch = 1;
      const float* ap = wa + p * r.stride_a + (r.trans_a ? i0 : i0 * r.lda);
      cpu::gemm(part, ap, wb + p * r.stride_b, block.data());
      bf16* cp = c + p * r.stride_c + i0 * r.ldc;
      const float* bp = block.data();
#pragma omp parallel for schedule(static) if (part.m * r.n > cpu::kParallelMin)
      for (int64_t i = 0; i < part.m; ++i)
        cpu::round_to_bf16(cp + i * r.ldc, bp + i * r.n, r.n);
    }
  }
}

void CpuBackend::fp8_encode(fp8* out, const float* in, int64_t n, float scale, kmath::Fp8 format) {
  cpu::elementwise<float>(
      n, [=](int64_t i) { out[i] = kmath::fp8_from_float(in[i] / scale, format); });
}

void CpuBackend::fp8_encode(fp8* out, const bf16* in, int64_t n, float scale, kmath::Fp8 format) {
  cpu::elementwise<float>(n, [=](int64_t i) {
    out[i] = kmath::fp8_from_float(kmath::float_from_bf16(in[i]) / scale, format);
  });
}

// Both operands decoded to their exact f32 values, then the f32 GEMM of the same arguments: the
// products are exact in f32, so this is the FP8 GEMM with the f32 GEMM's order of additions.
void CpuBackend::gemm_fp8(const GemmArgs& args, const fp8* a, kmath::Fp8 a_format, const fp8* b,
                          kmath::Fp8 b_format, float* c) {
  const GemmArgs r = resolve_fp8_gemm_args(args, a_format, b_format);
  if (r.m == 0 || r.n == 0) return;
  if (r.k == 0) {
    cpu::scale_gemm_output(r, c);
    return;
  }
  const int64_t a_span = operand_span(1, 0, r.trans_a ? r.k : r.m, r.trans_a ? r.m : r.k, r.lda);
  const int64_t b_span = operand_span(1, 0, r.trans_b ? r.n : r.k, r.trans_b ? r.k : r.n, r.ldb);
  std::vector<float> wide(static_cast<size_t>(a_span + b_span));
  float* wa = wide.data();
  float* wb = wide.data() + a_span;
  cpu::elementwise<float>(a_span,
                          [=](int64_t i) { wa[i] = kmath::float_from_fp8(a[i], a_format); });
  cpu::elementwise<float>(b_span,
                          [=](int64_t i) { wb[i] = kmath::float_from_fp8(b[i], b_format); });
  cpu::gemm(r, wa, wb, c);
}

void CpuBackend::fp8_encode_scaled(fp8* out, const float* in, int64_t n, const float* scale,
                                   kmath::Fp8 format) {
  fp8_encode(out, in, n, *scale, format);
}

void CpuBackend::fp8_encode_scaled(fp8* out, const bf16* in, int64_t n, const float* scale,
                                   kmath::Fp8 format) {
  fp8_encode(out, in, n, *scale, format);
}

void CpuBackend::fp8_scale_from_amax(float* scale, const float* amax, int64_t n, float factor) {
  for (int64_t i = 0; i < n; ++i)
    scale[i] = kmath::fp8_scale_from_amax(amax[i], factor);
}

void CpuBackend::gemm_fp8_scaled(const GemmArgs& args, const fp8* a, kmath::Fp8 a_format,
                                 const float* scale_a, const fp8* b, kmath::Fp8 b_format,
                                 const float* scale_b, float* c) {
  GemmArgs scaled = args;
  scaled.alpha = args.alpha * *scale_a * *scale_b;
  gemm_fp8(scaled, a, a_format, b, b_format, c);
}

std::string CpuBackend::fp8_gemm_missing_reason() const {
  return "";
}

void CpuBackend::gemm(const GemmArgs& args, const float* a, const float* b, float* c) {
  cpu::gemm(args, a, b, c);
}

void CpuBackend::gemm(const GemmArgs& args, const bf16* a, const bf16* b, float* c) {
  const GemmArgs r = resolve_gemm_args(args);
  if (r.batch == 0 || r.m == 0 || r.n == 0) return;
  if (r.k == 0) {
    cpu::scale_gemm_output(r, c);
  } else if (cpu::cpu_bf16_gemm_slow_reason().empty()) {
    cpu::onednn_gemm(r, a, b, c);
  } else {
    cpu::gemm_bf16_as_f32(r, a, b, c);
  }
}

void CpuBackend::gemm(const GemmArgs& args, const bf16* a, const bf16* b, bf16* c) {
  const GemmArgs r = resolve_gemm_args(args);
  ENGINE_CHECK(r.beta == 0.0f, "gemm with a bf16 C: beta must be 0 (C is written, not read)");
  if (r.batch == 0 || r.m == 0 || r.n == 0) return;
  if (r.k == 0) {
    for (int64_t p = 0; p < r.batch; ++p)
      for (int64_t i = 0; i < r.m; ++i)
        std::fill_n(c + p * r.stride_c + i * r.ldc, r.n, bf16{0});
  } else if (cpu::cpu_bf16_gemm_slow_reason().empty()) {
    cpu::onednn_gemm(r, a, b, c);
  } else {
    cpu::gemm_bf16_as_f32(r, a, b, c);
  }
}

std::string CpuBackend::bf16_gemm_slow_reason() const {
  return cpu::cpu_bf16_gemm_slow_reason();
}

std::string CpuBackend::tf32_gemm_slow_reason() const {
  return "TF32 is a GPU tensor-core format; the CPU computes f32";
}

void CpuBackend::add_bias(float* out, const float* bias, int64_t N, int64_t C) {
  cpu::add_bias(out, bias, N, C);
}

void CpuBackend::bias_backward(float* dbias, const float* dout, int64_t N, int64_t C) {
  cpu::bias_backward(dbias, dout, N, C);
}

void CpuBackend::bias_backward(float* dbias, const bf16* dout, int64_t N, int64_t C) {
  cpu::bias_backward(dbias, dout, N, C);
}

}  // namespace core
