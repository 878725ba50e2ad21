// Op family: Causal multi-head attention: head split and merge, rotary positions, the attention
// core. A part of the Backend interface (core/backend.h: the conventions for pointers, shapes and
// accumulation); implemented per device in core/cpu/attention.cpp and core/cuda/attention.cu.
#pragma once

#include <cstdint>

#include "core/device.h"

namespace core {

// Which keys a query sees: query t of a head of batch row b sees keys [key_begin[b T + t], t]
// (documents: the position of its document's first token; a sliding window w: at least t - w + 1).
// key_begin is a device array [B, T] with key_begin[b T + t] <= t, non-decreasing along t (so a
// tile of queries needs only the keys from its first query's begin on); heads is H, the heads of
// one batch row (head bh belongs to row bh / H). The default, no array, is plain causal.
struct AttentionMask {
  const int32_t* key_begin = nullptr;
  int64_t heads = 1;
};

class AttentionOps {
 public:
  virtual ~AttentionOps() = default;

  // qkv [B, T, 3, H, hd] (the output of the fused QKV projection) -> q, k, v each [B, H, T, hd].
  virtual void split_heads(float* q, float* k, float* v, const float* qkv, int64_t B, int64_t T,
                           int64_t H, int64_t hd) = 0;
  virtual void split_heads_backward(float* dqkv, const float* dq, const float* dk, const float* dv,
                                    int64_t B, int64_t T, int64_t H, int64_t hd) = 0;
  // bf16 precision: dqkv stored as bf16 (it feeds the QKV projection's GEMMs), written (=) whole.
  virtual void split_heads_backward(bf16* dqkv, const float* dq, const float* dk, const float* dv,
                                    int64_t B, int64_t T, int64_t H, int64_t hd) = 0;
  // a [B, H, T, hd] -> out [B, T, H*hd], and back.
  virtual void merge_heads(float* out, const float* a, int64_t B, int64_t T, int64_t H,
                           int64_t hd) = 0;
  // bf16 precision: out stored as bf16 (the output projection's GEMM input), each value rounded.
  virtual void merge_heads(bf16* out, const float* a, int64_t B, int64_t T, int64_t H,
                           int64_t hd) = 0;
  virtual void merge_heads_backward(float* da, const float* dout, int64_t B, int64_t T, int64_t H,
                                    int64_t hd) = 0;
  // Rotary embedding on x [BH, T, hd], in place allowed: for position t, half = hd/2,
  // inv_j = base^(-j/half), pairs (x_j, x_{j+half}) rotated by angle t*inv_j:
  // x_j' = x_j cos + x_{j+half} sin, x_{j+half}' = -x_j sin + x_{j+half} cos.
  // The backward applies the transposed rotation to dout and accumulates into dinp.
  virtual void rotary_forward(float* out, const float* inp, int64_t BH, int64_t T, int64_t hd,
                              float base) = 0;
  virtual void rotary_backward(float* dinp, const float* dout, int64_t BH, int64_t T, int64_t hd,
                               float base) = 0;
  // out = softmax(q k^T * scale + mask) v for BH heads of [T, hd], the mask causal and `mask`'s.
  // Saves lse [BH, T], each query row's log-sum-exp of its scaled visible scores: the backward
  // recomputes the probabilities from it, so nothing [T, T] is kept between the two
  // (core/attention_tiles.h). Key ranges no query of a tile sees are skipped whole.
  // `tf32` lets a device compute the products on TF32 tensor cores (CUDA: the same flash kernels
  // on tensor cores up to head dim 128, batched GEMMs over a scratch of scores past it,
  // core/attention_by_gemm.h); the CPU computes f32.
  virtual void attention_forward(float* out, float* lse, const float* q, const float* k,
                                 const float* v, int64_t BH, int64_t T, int64_t hd, float scale,
                                 const AttentionMask& mask = {}, bool tf32 = false) = 0;
  // From the forward's out and lse (with the forward's mask and tf32); dq, dk, dv accumulate.
  virtual void attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                  const float* out, const float* lse, const float* q,
                                  const float* k, const float* v, int64_t BH, int64_t T, int64_t hd,
                                  float scale, const AttentionMask& mask = {},
                                  bool tf32 = false) = 0;

  // The row steps of attention as GEMMs (core/attention_by_gemm.h) on BH heads' [T, T] scores;
  // the heads are counted from head0 for the mask (head h's batch row is (head0 + h) / mask.heads).
  // s = scale q k^T becomes, in place, p: each row's softmax over the keys it sees, 0 at the
  // others; lse [BH, T] gets the rows' log-sum-exp (kmath::FlashRow's, over the whole row).
  virtual void attention_softmax(float* s, float* lse, int64_t BH, int64_t T,
                                 const AttentionMask& mask, int64_t head0) = 0;
  // dp = dout v^T becomes, in place, ds = p (dp - delta_i) where query i sees key j, 0 elsewhere,
  // with delta_i = dout_i . out_i; p is attention_softmax's, dout and out [BH, T, hd].
  virtual void attention_softmax_backward(float* dp, const float* p, const float* dout,
                                          const float* out, int64_t BH, int64_t T, int64_t hd,
                                          const AttentionMask& mask, int64_t head0) = 0;
};

}  // namespace core
