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

// A batched GEMM over c heads: op(A) [m, k] @ op(B) [k, n] -> C [m, n], the heads of A, B and C
// at strides sa, sb, sc from each other and their rows at la, lb, lc (the packed scores: n).
GemmArgs head_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, int64_t c,
                   float alpha, float beta, bool tf32, int64_t sa, int64_t la, int64_t sb,
                   int64_t lb, int64_t sc, int64_t lc) {
  GemmArgs g;
  g.trans_a = trans_a, g.trans_b = trans_b;
  g.m = m, g.n = n, g.k = k;
  g.alpha = alpha, g.beta = beta;
  g.lda = la, g.ldb = lb, g.ldc = lc;
  g.batch = c;
  g.stride_a = sa, g.stride_b = sb, g.stride_c = sc;
  g.tf32 = tf32;
  return g;
}

// Consecutive heads of a tensor are one stride apart everywhere when its batch rows follow each
// other head-wise (packed heads); otherwise only within a batch row.
bool heads_uniform(const HeadStrides& s, int64_t heads) {
  return s.batch == heads * s.head;
}

// The heads from h0 one chunk takes: at most `chunk`, and within h0's batch row unless every
// tensor's heads are uniform.
int64_t chunk_at(int64_t h0, int64_t chunk, int64_t BH, const AttentionLayout& L) {
  int64_t c = std::min(chunk, BH - h0);
  const bool uniform = heads_uniform(L.q, L.heads) && heads_uniform(L.k, L.heads) &&
                       heads_uniform(L.v, L.heads) && heads_uniform(L.out, L.heads);
  if (!uniform) c = std::min(c, L.heads - h0 % L.heads);
  return c;
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
                               const AttentionMask& mask, const AttentionByGemm& opts,
                               const AttentionLayout& layout) {
  check_sizes("attention_forward_by_gemm", BH, T, hd);
  if (BH == 0 || T == 0) return;
  const AttentionLayout L = layout.resolved(T, hd);
  const int64_t chunk = heads_per_chunk(BH, T, 1, opts), TT = T * T;
  Tensor scores = Tensor::empty({chunk, T, T}, DType::F32, be.allocator());
  float* s = scores.data<float>();
  for (int64_t h0 = 0; h0 < BH; h0 += chunk_at(h0, chunk, BH, L)) {
    const int64_t c = chunk_at(h0, chunk, BH, L), H = L.heads;
    const HeadStrides &sq = L.q, &sk = L.k, &sv = L.v, &so = L.out;
    be.gemm(head_gemm(false, true, T, T, hd, c, scale, 0.0f, opts.tf32, sq.head, sq.row, sk.head,
                      sk.row, TT, T),
            q + sq.head_at(h0, H), k + sk.head_at(h0, H), s);
    be.attention_softmax(s, lse + h0 * T, c, T, mask, h0);
    be.gemm(head_gemm(false, false, T, hd, T, c, 1.0f, 0.0f, opts.tf32, TT, T, sv.head, sv.row,
                      so.head, so.row),
            s, v + sv.head_at(h0, H), out + so.head_at(h0, H));
  }
}

void attention_backward_by_gemm(Backend& be, float* dq, float* dk, float* dv, const float* dout,
                                const float* out, const float* q, const float* k, const float* v,
                                int64_t BH, int64_t T, int64_t hd, float scale,
                                const AttentionMask& mask, const AttentionByGemm& opts,
                                const AttentionLayout& layout) {
  check_sizes("attention_backward_by_gemm", BH, T, hd);
  if (BH == 0 || T == 0) return;
  const AttentionLayout L = layout.resolved(T, hd);
  const int64_t chunk = heads_per_chunk(BH, T, 2, opts), TT = T * T;
  Tensor probs = Tensor::empty({chunk, T, T}, DType::F32, be.allocator());
  Tensor dscores = Tensor::empty({chunk, T, T}, DType::F32, be.allocator());
  Tensor row_lse = Tensor::empty({chunk, T}, DType::F32, be.allocator());
  float *p = probs.data<float>(), *ds = dscores.data<float>();
  for (int64_t h0 = 0; h0 < BH; h0 += chunk_at(h0, chunk, BH, L)) {
    const int64_t c = chunk_at(h0, chunk, BH, L), H = L.heads;
    const HeadStrides &sq = L.q, &sk = L.k, &sv = L.v, &so = L.out;
    const int64_t aq = sq.head_at(h0, H), ak = sk.head_at(h0, H), av = sv.head_at(h0, H),
                  ao = so.head_at(h0, H);
    be.gemm(head_gemm(false, true, T, T, hd, c, scale, 0.0f, opts.tf32, sq.head, sq.row, sk.head,
                      sk.row, TT, T),
            q + aq, k + ak, p);
    be.attention_softmax(p, row_lse.data<float>(), c, T, mask, h0);
    // dV = P^T dO (P [queries, keys], so op(A) = P^T is [keys, queries]).
    be.gemm(head_gemm(true, false, T, hd, T, c, 1.0f, 0.0f, opts.tf32, TT, T, so.head, so.row,
                      sv.head, sv.row),
            p, dout + ao, dv + av);
    be.gemm(head_gemm(false, true, T, T, hd, c, 1.0f, 0.0f, opts.tf32, so.head, so.row, sv.head,
                      sv.row, TT, T),
            dout + ao, v + av, ds);
    be.attention_softmax_backward(ds, p, dout + ao, out + ao, c, T, hd, mask, h0, so.head, so.row);
    be.gemm(head_gemm(false, false, T, hd, T, c, scale, 0.0f, opts.tf32, TT, T, sk.head, sk.row,
                      sq.head, sq.row),
            ds, k + ak, dq + aq);
    be.gemm(head_gemm(true, false, T, hd, T, c, scale, 0.0f, opts.tf32, TT, T, sq.head, sq.row,
                      sk.head, sk.row),
            ds, q + aq, dk + ak);
  }
}

}  // namespace core
