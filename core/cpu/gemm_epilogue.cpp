// The CPU backend's GEMM with an epilogue (core/ops/gemm.h, GemmOps::gemm_epilogue): the GEMM this
// backend runs anyway (gemm.cpp), then one pass over blocks of D's rows applying the epilogue with
// the same kernels the unfused ops run (gemm_kernels.h, elementwise_kernels.h), so every value
// is bit for bit the unfused sequence's: copy C to D, GEMM, add_bias, gelu_forward (aux = the
// pre-activation), gelu_backward, bias_backward.
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/cpu/bf16_rounding.h"
#include "core/cpu/cpu_backend.h"
#include "core/cpu/elementwise_kernels.h"
#include "core/cpu/gemm_kernels.h"
#include "core/cpu/parallel_loops.h"

namespace core {

namespace {

// fn(row0, rows) over blocks of kRowBlock rows of an [m, n] matrix, in parallel.
template <typename Fn>
void row_blocks(int64_t m, int64_t n, Fn fn) {
  const int64_t blocks = (m + cpu::kRowBlock - 1) / cpu::kRowBlock;
#pragma omp parallel for schedule(static) if (m * n > cpu::kParallelMin)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t r0 = blk * cpu::kRowBlock;
    fn(r0, std::min(cpu::kRowBlock, m - r0));
  }
}

// X = alpha op(A) op(B) + beta C into x (at ldc): C first copied into x when it is elsewhere, as
// the unfused sequence copies the residual into the output before the GEMM accumulates into it.
template <typename In>
void product(CpuBackend& backend, const GemmArgs& r, const float* c, const In* a, const In* b,
             float* x) {
  if (r.beta != 0.0f && c && c != x) {
    for (int64_t row = 0; row < r.m; ++row)
      std::memcpy(x + row * r.ldc, c + row * r.ldc, static_cast<size_t>(r.n) * sizeof(float));
  }
  backend.gemm(r, a, b, x);
}

// An f32 D: X lands in D (bias_gelu: in aux, the pre-activation, and D gets its GELU).
template <typename In>
void epilogue_f32(CpuBackend& backend, const GemmArgs& r, const GemmEpilogueArgs& ep, const In* a,
                  const In* b, float* d, float* aux) {
  const int64_t n = r.n;
  switch (ep.kind) {
    case GemmEpilogue::none:
      product(backend, r, ep.c, a, b, d);
      return;
    case GemmEpilogue::bias:
      product(backend, r, ep.c, a, b, d);
      row_blocks(r.m, n,
                 [&](int64_t r0, int64_t rows) { cpu::add_bias(d + r0 * n, ep.bias, rows, n); });
      return;
    case GemmEpilogue::bias_gelu:
      product(backend, r, ep.c, a, b, aux);
      row_blocks(r.m, n, [&](int64_t r0, int64_t rows) {
        cpu::add_bias(aux + r0 * n, ep.bias, rows, n);
        cpu::gelu_forward(d + r0 * n, aux + r0 * n, rows * n);
      });
      return;
    case GemmEpilogue::dgelu:
      // gelu_backward into a zeroed d pre: 0 + g x, the value g x (a zero's sign aside).
      product(backend, r, ep.c, a, b, d);
      row_blocks(r.m, n, [&](int64_t r0, int64_t rows) {
        float* x = d + r0 * n;
        const float* pre = aux + r0 * n;
        cpu::elementwise<float>(rows * n, [=](int64_t i) {
          x[i] = kmath::gelu_tanh_grad<cpu::FastMath>(pre[i]) * x[i];
        });
      });
      return;
    case GemmEpilogue::bgrad:
      cpu::bias_backward(ep.dbias, a, r.k, r.m);
      product(backend, r, ep.c, a, b, d);
      return;
  }
}

// A bf16 D: X in an f32 scratch (with beta != 0 starting from C widened: ep.c_bf16, or D in
// place), then each stored value rounded once.
void epilogue_bf16(CpuBackend& backend, const GemmArgs& r, const GemmEpilogueArgs& ep,
                   const bf16* a, const bf16* b, bf16* d, bf16* aux) {
  const int64_t n = r.n, ld = r.ldc;
  std::vector<float> scratch(static_cast<size_t>((r.m - 1) * ld + n));
  float* x = scratch.data();
  if (r.beta != 0.0f) {
    const bf16* c = ep.c_bf16 ? ep.c_bf16 : d;
    row_blocks(r.m, n, [&](int64_t r0, int64_t rows) {
      for (int64_t row = r0; row < r0 + rows; ++row)
        for (int64_t j = 0; j < n; ++j)
          x[row * ld + j] = kmath::float_from_bf16(c[row * ld + j]);
    });
  }
  backend.gemm(r, a, b, x);
  switch (ep.kind) {
    case GemmEpilogue::none:
      row_blocks(r.m, n, [&](int64_t r0, int64_t rows) {
        for (int64_t row = r0; row < r0 + rows; ++row)
          cpu::round_to_bf16(d + row * ld, x + row * ld, n);
      });
      return;
    case GemmEpilogue::bias:
      row_blocks(r.m, n, [&](int64_t r0, int64_t rows) {
        cpu::add_bias(x + r0 * n, ep.bias, rows, n);
        cpu::round_to_bf16(d + r0 * n, x + r0 * n, rows * n);
      });
      return;
    case GemmEpilogue::bias_gelu:
      row_blocks(r.m, n, [&](int64_t r0, int64_t rows) {
        cpu::add_bias(x + r0 * n, ep.bias, rows, n);
        cpu::round_to_bf16(aux + r0 * n, x + r0 * n, rows * n);
        cpu::gelu_forward(d + r0 * n, x + r0 * n, rows * n);
      });
      return;
    case GemmEpilogue::dgelu:
      row_blocks(r.m, n, [&](int64_t r0, int64_t rows) {
        std::vector<float> pre(static_cast<size_t>(rows * n));
        const bf16* stored = aux + r0 * n;
        for (int64_t i = 0; i < rows * n; ++i)
          pre[i] = kmath::float_from_bf16(stored[i]);
        cpu::gelu_backward(d + r0 * n, pre.data(), x + r0 * n, rows * n);
      });
      return;
    case GemmEpilogue::bgrad:
      break;  // refused by resolve_gemm_epilogue_args
  }
}

}  // namespace

void CpuBackend::gemm_epilogue(const GemmArgs& args, const GemmEpilogueArgs& ep, const float* a,
                               const float* b, float* d, float* aux) {
  const GemmArgs r = resolve_gemm_epilogue_args(args, ep, false, aux != nullptr);
  if (r.m == 0 || r.n == 0) return;
  epilogue_f32(*this, r, ep, a, b, d, aux);
}

void CpuBackend::gemm_epilogue(const GemmArgs& args, const GemmEpilogueArgs& ep, const bf16* a,
                               const bf16* b, float* d, float* aux) {
  const GemmArgs r = resolve_gemm_epilogue_args(args, ep, false, aux != nullptr);
  if (r.m == 0 || r.n == 0) return;
  epilogue_f32(*this, r, ep, a, b, d, aux);
}

void CpuBackend::gemm_epilogue(const GemmArgs& args, const GemmEpilogueArgs& ep, const bf16* a,
                               const bf16* b, bf16* d, bf16* aux) {
  const GemmArgs r = resolve_gemm_epilogue_args(args, ep, true, aux != nullptr);
  if (r.m == 0 || r.n == 0) return;
  epilogue_bf16(*this, r, ep, a, b, d, aux);
}

}  // namespace core
