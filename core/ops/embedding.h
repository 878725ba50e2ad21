// Op family: Token embeddings, with learned positions when given; record #89's bigram hash
// embedding and smear.
// A part of the Backend interface (core/backend.h: the conventions for pointers, shapes and
// accumulation); implemented per device in core/cpu/embedding.cpp and core/cuda/embedding.cu.
#pragma once

#include <cstdint>

#include "core/device.h"

namespace core {

class EmbeddingOps {
 public:
  virtual ~EmbeddingOps() = default;

  // out[b, t, :] = wte[tokens[b, t], :] (+ wpe[t, :] when wpe is not null).
  virtual void embedding_forward(float* out, const int32_t* tokens, const float* wte,
                                 const float* wpe, int64_t B, int64_t T, int64_t D) = 0;
  // The same stored as bf16 (bf16 precision's residual stream): each f32 sum rounded once.
  virtual void embedding_forward(bf16* out, const int32_t* tokens, const float* wte,
                                 const float* wpe, int64_t B, int64_t T, int64_t D) = 0;
  // dwte[tokens[b, t], :] += dout[b, t, :]; dwpe[t, :] += sum_b dout[b, t, :] when dwpe not null.
  // A repeated token's rows add in position order on both backends (deterministic).
  virtual void embedding_backward(float* dwte, float* dwpe, const float* dout,
                                  const int32_t* tokens, int64_t B, int64_t T, int64_t D) = 0;

  // Record #89's bigram hash embedding (model/layers/bigram_embedding.h). ids[b, t] =
  // kmath::bigram_hash_at(tokens[b, :], t, table_rows - 1), each row of T tokens hashed on its
  // own (the record's one flat row per rank); table_rows in [2, 2^31].
  virtual void bigram_hash(int32_t* ids, const int32_t* tokens, int64_t B, int64_t T,
                           int64_t table_rows) = 0;
  // The sign trick: x[b, t, :] *= signs[kmath::bigram_sign_row(tokens[b, :], t, sign_rows), :]
  // for signs [sign_rows, D] of +-1, in place; a diagonal of +-1, so it is its own backward.
  virtual void bigram_signs(float* x, const int32_t* tokens, const float* signs, int64_t B,
                            int64_t T, int64_t D, int64_t sign_rows) = 0;
  // Record #34's smear over rows x [B, T, D] (positions t of a row; it crosses documents):
  // out[t] = x[t] + lambda[0] s_t x[t - 1] for t >= 1, out[0] = x[0], with s_t =
  // sigmoid(x[t, :K] . w) written to gate [B, T] (0 at t = 0). out must not overlap x.
  virtual void smear_forward(float* out, float* gate, const float* x, const float* w,
                             const float* lambda, int64_t B, int64_t T, int64_t D, int64_t K) = 0;
  // Its backward from dout: dx written (=), dw [K] and dlambda [1] accumulated (+=), each sum in
  // a fixed order (core/cpu/embedding_kernels.h has the formulas).
  virtual void smear_backward(float* dx, float* dw, float* dlambda, const float* x, const float* w,
                              const float* lambda, const float* gate, const float* dout, int64_t B,
                              int64_t T, int64_t D, int64_t K) = 0;
};

}  // namespace core
