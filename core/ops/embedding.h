// Op family: Token embeddings, with learned positions when given.
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
};

}  // namespace core
