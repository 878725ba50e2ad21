// The residual stream's arrays (the embedding output, each layer's output, the recipe's mixes):
// f32, or in bf16 precision bf16 only (docs/precision.md); exactly one of the two is set once
// planned. Their producers and readers for either dtype.
#pragma once

#include <cstdint>

#include "core/backend.h"

namespace model {

struct Stream {
  float* f32 = nullptr;
  core::bf16* bf16 = nullptr;
};

// out = wa a + wb b over n elements (a null weight is 1, a null b is left out; weights are
// device scalars), in the stream's dtype (bf16: computed in f32 and rounded once).
void mix_stream(core::Backend& backend, Stream out, const float* wa, Stream a, const float* wb,
                Stream b, int64_t n);
// Its backward: da += wa dout, db += wb dout, dwa += <a, dout>, dwb += <b, dout> (each where
// not null).
void mix_stream_backward(core::Backend& backend, float* da, float* db, float* dwa, float* dwb,
                         const float* wa, Stream a, const float* wb, Stream b, const float* dout,
                         int64_t n);

}  // namespace model
