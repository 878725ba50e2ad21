// Op family: Causal multi-head attention: head split and merge, rotary positions, the attention
// core. A part of the Backend interface (core/backend.h: the conventions for pointers, shapes and
// accumulation); implemented per device in core/cpu/attention.cpp and core/cuda/attention.cu.
#pragma once

#include <cstdint>

#include "core/device.h"
#include "core/kernel_math.h"

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

// Where one attention tensor's heads live: head bh = b H + h (batch row b, head h of H) has its
// row t (position), column d at b batch + h head + t row + d from the tensor's pointer.
struct HeadStrides {
  int64_t batch = 0, head = 0, row = 0;
  ENGINE_HD int64_t head_at(int64_t bh, int64_t heads) const {
    return bh / heads * batch + bh % heads * head;
  }
};

// The layout of attention's tensors: q, k, v and out (each gradient has its tensor's layout,
// dout out's). The default is packed [BH, T, hd] heads; the model reads q, k and v straight from
// its fused qkv output [B, T, 3, H, hd] (token_rows(3 D) at qkv, qkv + D, qkv + 2 D) and writes
// out as [B, T, H hd] (token_rows(D)), the output projection's input: no head split or merge.
struct AttentionLayout {
  int64_t heads = 0;  // H; 0: the packed [BH, T, hd] layout for every tensor
  HeadStrides q, k, v, out;

  // Heads [B, H, T, hd], one after another.
  static HeadStrides packed_heads(int64_t H, int64_t T, int64_t hd) {
    return {H * T * hd, T * hd, hd};
  }
  // Tokens [B, T, ld] with head h at columns [h hd, (h + 1) hd) of each token's row.
  static HeadStrides token_rows(int64_t T, int64_t hd, int64_t ld) { return {T * ld, hd, ld}; }
  // q, k, v, out all packed [BH, T, hd] (heads 1: head bh is batch row bh).
  static AttentionLayout packed(int64_t T, int64_t hd) {
    const HeadStrides s = packed_heads(1, T, hd);
    return {1, s, s, s, s};
  }
  // The default (heads 0) resolved to packed.
  AttentionLayout resolved(int64_t T, int64_t hd) const {
    return heads > 0 ? *this : packed(T, hd);
  }
};

// Record #89's variants of the modern blocks' rotary (AttentionOps::qk_norm_rotary_*): inv_freq a
// device array [hd / 2] of the pairs' frequencies in place of kmath::rotary_inv_freq's (YaRN's
// rescaled ones; null: those of base and truncated), and `paired` turning head h of token t at
// position 2t + h mod 2 (a paired-head block's) in place of t (kmath::rotary_position).
struct RotaryVariant {
  const float* inv_freq = nullptr;
  bool paired = false;
};

// Per-token, per-head coefficients (attention_out_*): c[n, h] = values[n stride + h] for token n
// of B T (stride 0: one row for every token); grads (null: none wanted) gets d loss / d c added
// at the same places (stride 0: summed over the tokens). model::CoefView on the device.
struct HeadCoefs {
  const float* values = nullptr;  // null: off
  float* grads = nullptr;
  int64_t stride = 0;
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
  // The modern blocks' attention inputs from qkv [B, T, 3, H, hd] in one pass: the heads split
  // into q, k, v [B, H, T, hd] (q and k as split, for the backward), q and k RMS-normalised over
  // hd (rstd [B H T] each, eps inside the root) and rotated (rotary at their position, as
  // rotary_forward) into qr and kr. Bit for bit split_heads, rmsnorm_forward of q and of k, then
  // rotary_forward of each (the CPU; a device within its float rounding). `variant`: YaRN's
  // frequencies, paired heads' positions (RotaryVariant).
  virtual void qk_norm_rotary_forward(float* qr, float* kr, float* q, float* k, float* v,
                                      float* q_rstd, float* k_rstd, const float* qkv, int64_t B,
                                      int64_t T, int64_t H, int64_t hd, float eps, float base,
                                      bool truncated, const RotaryVariant& variant = {}) = 0;
  // Its backward: d qkv (every element written, =) from the gradients of qr, kr and v and the
  // forward's q, k and rstd: bit for bit rotary_backward and rmsnorm_backward, each into zeroed
  // buffers, then split_heads_backward into a zeroed d qkv (the CPU). The bf16 form stores each
  // d qkv value rounded once, as split_heads_backward's bf16 form. `variant` the forward's.
  virtual void qk_norm_rotary_backward(float* dqkv, const float* dqr, const float* dkr,
                                       const float* dv, const float* q, const float* k,
                                       const float* q_rstd, const float* k_rstd, int64_t B,
                                       int64_t T, int64_t H, int64_t hd, float base, bool truncated,
                                       const RotaryVariant& variant = {}) = 0;
  virtual void qk_norm_rotary_backward(bf16* dqkv, const float* dqr, const float* dkr,
                                       const float* dv, const float* q, const float* k,
                                       const float* q_rstd, const float* k_rstd, int64_t B,
                                       int64_t T, int64_t H, int64_t hd, float base, bool truncated,
                                       const RotaryVariant& variant = {}) = 0;
  // a [B, H, T, hd] -> out [B, T, H*hd], and back.
  virtual void merge_heads(float* out, const float* a, int64_t B, int64_t T, int64_t H,
                           int64_t hd) = 0;
  virtual void merge_heads_backward(float* da, const float* dout, int64_t B, int64_t T, int64_t H,
                                    int64_t hd) = 0;
  // Rotary embedding on x [BH, T, hd], in place allowed: for position t, half = hd/2,
  // inv_j = base^(-j/half), pairs (x_j, x_{j+half}) rotated by angle t*inv_j:
  // x_j' = x_j cos + x_{j+half} sin, x_{j+half}' = -x_j sin + x_{j+half} cos.
  // `truncated`: the record's half-truncated frequencies (kmath::rotary_inv_freq; hd a multiple
  // of 4, at least 8). The backward applies the transposed rotation to dout and accumulates
  // into dinp.
  virtual void rotary_forward(float* out, const float* inp, int64_t BH, int64_t T, int64_t hd,
                              float base, bool truncated = false) = 0;
  virtual void rotary_backward(float* dinp, const float* dout, int64_t BH, int64_t T, int64_t hd,
                               float base, bool truncated = false) = 0;
  // Record #89's partial key offset on k [BH, T, hd] rotated by the truncated rotary: the
  // dimensions it leaves unrotated (kmath::key_offset_dim: d mod hd/2 >= hd/4) of position
  // t >= 1 take position t - 1's, across documents; the others and position 0 are copied. The
  // backward is the reverse shift: dk[t] = dout[t + 1] (t < T - 1; 0 at T - 1) on those
  // dimensions, plus dout[0] at t = 0, dout itself on the others. Both write (=); out and k (dk and
  // dout) must not overlap.
  virtual void key_offset_forward(float* out, const float* k, int64_t BH, int64_t T,
                                  int64_t hd) = 0;
  virtual void key_offset_backward(float* dk, const float* dout, int64_t BH, int64_t T,
                                   int64_t hd) = 0;
  // out = softmax(q k^T * scale + mask) v for BH heads of [T, hd], the mask causal and `mask`'s,
  // each tensor where `layout` puts it (out written, =; a strided layout's other columns kept).
  // Saves lse [BH, T], each query row's log-sum-exp of its scaled visible scores: the backward
  // recomputes the probabilities from it, so nothing [T, T] is kept between the two
  // (core/attention_tiles.h). Key ranges no query of a tile sees are skipped whole.
  // `tf32` lets a device compute the products on TF32 tensor cores (CUDA: the same flash kernels
  // on tensor cores up to head dim 128, batched GEMMs over a scratch of scores past it,
  // core/attention_by_gemm.h); the CPU computes f32.
  virtual void attention_forward(float* out, float* lse, const float* q, const float* k,
                                 const float* v, int64_t BH, int64_t T, int64_t hd, float scale,
                                 const AttentionMask& mask = {}, bool tf32 = false,
                                 const AttentionLayout& layout = {}) = 0;
  // From the forward's out and lse (with the forward's mask, tf32 and layout); dq, dk, dv are
  // written (=, each element's only producer), so the model's d qkv needs no zeroing.
  virtual void attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                  const float* out, const float* lse, const float* q,
                                  const float* k, const float* v, int64_t BH, int64_t T, int64_t hd,
                                  float scale, const AttentionMask& mask = {}, bool tf32 = false,
                                  const AttentionLayout& layout = {}) = 0;
  // bf16 precision (docs/precision.md): the same attention computed in f32, out stored as bf16
  // (each value the f32 overload's rounded once, kmath::bf16_from_float; lse f32), so the output
  // projection reads it as written and no f32 copy is kept.
  virtual void attention_forward(bf16* out, float* lse, const float* q, const float* k,
                                 const float* v, int64_t BH, int64_t T, int64_t hd, float scale,
                                 const AttentionMask& mask = {}, bool tf32 = false,
                                 const AttentionLayout& layout = {}) = 0;
  // Its backward reads the bf16 out (delta_i = dout_i . out_i from the widened values, as the f32
  // overload computes it from those values) and writes (=) dq, dk, dv: as bf16, each the f32
  // value rounded once (GPT-2: straight into the bf16 d qkv [B, T, 3, H, hd] the QKV projection's
  // GEMMs read), or as f32 (the modern blocks' QK-norm and rotary backward take them on).
  virtual void attention_backward(bf16* dq, bf16* dk, bf16* dv, const float* dout, const bf16* out,
                                  const float* lse, const float* q, const float* k, const float* v,
                                  int64_t BH, int64_t T, int64_t hd, float scale,
                                  const AttentionMask& mask = {}, bool tf32 = false,
                                  const AttentionLayout& layout = {}) = 0;
  virtual void attention_backward(float* dq, float* dk, float* dv, const float* dout,
                                  const bf16* out, const float* lse, const float* q, const float* k,
                                  const float* v, int64_t BH, int64_t T, int64_t hd, float scale,
                                  const AttentionMask& mask = {}, bool tf32 = false,
                                  const AttentionLayout& layout = {}) = 0;

  // Record #89's attention output corrections, y [B T, H hd] (the attention's output as stored,
  // token rows) into out (the same layout and type; in place allowed): per token n and head h,
  // out = gate[n, h] (y - tanh(alpha[n, h]) (y.v / max(|v|^2, 1e-8)) v), v the head's value row
  // of v [B, H, T, hd] (kmath::attention_out_row_forward). alpha off: no XSA (v not read); gate
  // off: 1.
  virtual void attention_out_forward(float* out, const float* y, const float* v, int64_t B,
                                     int64_t T, int64_t H, int64_t hd, const HeadCoefs& alpha,
                                     const HeadCoefs& gate) = 0;
  virtual void attention_out_forward(bf16* out, const bf16* y, const float* v, int64_t B, int64_t T,
                                     int64_t H, int64_t hd, const HeadCoefs& alpha,
                                     const HeadCoefs& gate) = 0;
  // Its backward from dout [B T, H hd]: dy written (=, f32 token rows; not dout's memory), dv
  // added to (+=, with XSA), and alpha's and gate's grads added to (d alpha = d tanh (1 - tanh^2)).
  virtual void attention_out_backward(float* dy, float* dv, const float* dout, const float* y,
                                      const float* v, int64_t B, int64_t T, int64_t H, int64_t hd,
                                      const HeadCoefs& alpha, const HeadCoefs& gate) = 0;
  virtual void attention_out_backward(float* dy, float* dv, const float* dout, const bf16* y,
                                      const float* v, int64_t B, int64_t T, int64_t H, int64_t hd,
                                      const HeadCoefs& alpha, const HeadCoefs& gate) = 0;

  // The row steps of attention as GEMMs (core/attention_by_gemm.h) on BH heads' [T, T] scores;
  // the heads are counted from head0 for the mask (head h's batch row is (head0 + h) / mask.heads).
  // s = scale q k^T becomes, in place, p: each row's softmax over the keys it sees, 0 at the
  // others; lse [BH, T] gets the rows' log-sum-exp (kmath::FlashRow's, over the whole row).
  virtual void attention_softmax(float* s, float* lse, int64_t BH, int64_t T,
                                 const AttentionMask& mask, int64_t head0) = 0;
  // dp = dout v^T becomes, in place, ds = p (dp - delta_i) where query i sees key j, 0 elsewhere,
  // with delta_i = dout_i . out_i; p is attention_softmax's; head h's row t of dout and out at
  // h head_stride + t row_stride (0, 0: packed [BH, T, hd]).
  virtual void attention_softmax_backward(float* dp, const float* p, const float* dout,
                                          const float* out, int64_t BH, int64_t T, int64_t hd,
                                          const AttentionMask& mask, int64_t head0,
                                          int64_t head_stride = 0, int64_t row_stride = 0) = 0;
};

}  // namespace core
