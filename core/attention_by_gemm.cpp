#include "core/attention_by_gemm.h"

#include <algorithm>
#include <string>

#include "core/check.h"
#include "core/tensor.h"

namespace core {
namespace {

// The heads of one chunk: as many as `buffers` [T, T] score buffers of each fit the scratch.
int64_t heads_per_chunk(int64_t BH, int64_t T, int buffers, const AttentionByGemm& opts) {
  const size_t per_head = static_cast<size_t>(buffers) * static_cast<size_t>(T * T) * sizeof(float);
  const auto fit = static_cast<int64_t>(opts.max_scratch_bytes / per_head);
  return std::clamp<int64_t>(fit, 1, BH);
}

// A batched GEMM over c heads: op(A) [m, k] @ op(B) [k, n] -> C [m, n] at per-head strides.
GemmArgs head_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, int64_t c,
                   float alpha, float beta, bool tf32) {
  GemmArgs g;
  g.trans_a = trans_a, g.trans_b = trans_b;
  g.m = m, g.n = n, g.k = k;
  g.alpha = alpha, g.beta = beta;
  g.batch = c;
  g.stride_a = m * k, g.stride_b = k * n, g.stride_c = m * n;
  g.tf32 = tf32;
  return g;
}

void check_sizes(const char* op, int64_t BH, int64_t T, int64_t hd) {
  ENGINE_CHECK(BH >= 0 && T >= 0 && hd > 0, std::string(op) + ": bad sizes BH " +
                                                std::to_string(BH) + " T " + std::to_string(T) +
                                                " hd " + std::to_string(hd));
}

}  // namespace

bool attention_by_gemm_fits(int64_t T, const AttentionByGemm& opts) {
  return 2 * static_cast<size_t>(T) * static_cast<size_t>(T) * sizeof(float) <=
         opts.max_scratch_bytes;
}

void attention_forward_by_gemm(Backend& be, float* out, float* lse, const float* q, const float* k,
                               const float* v, int64_t BH, int64_t T, int64_t hd, float scale,
                               const AttentionMask& mask, const AttentionByGemm& opts) {
  check_sizes("attention_forward_by_gemm", BH, T, hd);
  if (BH == 0 || T == 0) return;
  const int64_t chunk = heads_per_chunk(BH, T, 1, opts);
  Tensor scores = Tensor::empty({chunk, T, T}, DType::F32, be.allocator());
  float* s = scores.data<float>();
  for (int64_t h0 = 0; h0 < BH; h0 += chunk) {
    const int64_t c = std::min(chunk, BH - h0), at = h0 * T * hd;
    be.gemm(head_gemm(false, true, T, T, hd, c, scale, 0.0f, opts.tf32), q + at, k + at, s);
    be.attention_softmax(s, lse + h0 * T, c, T, mask, h0);
    be.gemm(head_gemm(false, false, T, hd, T, c, 1.0f, 0.0f, opts.tf32), s, v + at, out + at);
  }
}

void attention_backward_by_gemm(Backend& be, float* dq, float* dk, float* dv, const float* dout,
                                const float* out, const float* q, const float* k, const float* v,
                                int64_t BH, int64_t T, int64_t hd, float scale,
                                const AttentionMask& mask, const AttentionByGemm& opts) {
  check_sizes("attention_backward_by_gemm", BH, T, hd);
  if (BH == 0 || T == 0) return;
  const int64_t chunk = heads_per_chunk(BH, T, 2, opts);
  Tensor probs = Tensor::empty({chunk, T, T}, DType::F32, be.allocator());
  Tensor dscores = Tensor::empty({chunk, T, T}, DType::F32, be.allocator());
  Tensor row_lse = Tensor::empty({chunk, T}, DType::F32, be.allocator());
  float *p = probs.data<float>(), *ds = dscores.data<float>();
  for (int64_t h0 = 0; h0 < BH; h0 += chunk) {
    const int64_t c = std::min(chunk, BH - h0), at = h0 * T * hd;
    be.gemm(head_gemm(false, true, T, T, hd, c, scale, 0.0f, opts.tf32), q + at, k + at, p);
    be.attention_softmax(p, row_lse.data<float>(), c, T, mask, h0);
    // dV += P^T dO (P [queries, keys], so op(A) = P^T is [keys, queries]).
    be.gemm(head_gemm(true, false, T, hd, T, c, 1.0f, 1.0f, opts.tf32), p, dout + at, dv + at);
    be.gemm(head_gemm(false, true, T, T, hd, c, 1.0f, 0.0f, opts.tf32), dout + at, v + at, ds);
    be.attention_softmax_backward(ds, p, dout + at, out + at, c, T, hd, mask, h0);
    be.gemm(head_gemm(false, false, T, hd, T, c, scale, 1.0f, opts.tf32), ds, k + at, dq + at);
    be.gemm(head_gemm(true, false, T, hd, T, c, scale, 1.0f, opts.tf32), ds, q + at, dk + at);
  }
}

}  // namespace core
