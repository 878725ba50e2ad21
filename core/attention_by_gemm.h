// Causal attention (core/ops/attention.h's attention_forward and attention_backward) as batched
// GEMMs over a scratch of [heads, T, T] scores, for devices whose GEMMs run on tensor cores:
//   forward   S = scale Q K^T, P = the rows' softmax over the keys they see (lse kept), O = P V;
//   backward  S again and P from it (the forward's P, recomputed), dV += P^T dO, dP = dO V^T,
//             dS = P (dP - delta), dQ = scale dS K, dK = scale dS^T Q (all three written, =).
// The tensors are where an AttentionLayout puts them: a chunk's heads are at one stride from
// each other (the GEMMs' batch stride, their rows at the layout's row stride as the leading
// dimension), so a chunk stays within a batch row unless every tensor's heads are packed.
// The GEMMs do the masked half too (twice the flash kernels' multiply-adds) and the scores pass
// through memory, but on tensor cores that is still several times faster than the flash kernels'
// FMA tiles. The row steps are the backend's attention_softmax ops; the heads go in chunks whose
// scores fit the scratch, so memory stays bounded whatever B and H are.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/backend.h"

namespace core {

struct AttentionByGemm {
  bool tf32 = true;                              // GemmArgs::tf32 for the four products
  size_t max_scratch_bytes = size_t{256} << 20;  // the [heads, T, T] scores of one chunk
};

// Whether one head's scores fit the scratch of `opts` in the backward (two [T, T] buffers).
bool attention_by_gemm_fits(int64_t T, const AttentionByGemm& opts = {});

void attention_forward_by_gemm(Backend& be, float* out, float* lse, const float* q, const float* k,
                               const float* v, int64_t BH, int64_t T, int64_t hd, float scale,
                               const AttentionMask& mask, const AttentionByGemm& opts = {},
                               const AttentionLayout& layout = {});

// dq, dk, dv written, as attention_backward's; lse is not read (P is recomputed whole).
void attention_backward_by_gemm(Backend& be, float* dq, float* dk, float* dv, const float* dout,
                                const float* out, const float* q, const float* k, const float* v,
                                int64_t BH, int64_t T, int64_t hd, float scale,
                                const AttentionMask& mask, const AttentionByGemm& opts = {},
                                const AttentionLayout& layout = {});

}  // namespace core
