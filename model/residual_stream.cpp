#include "model/residual_stream.h"

namespace model {

void mix_stream(core::Backend& backend, Stream out, const float* wa, Stream a, const float* wb,
                Stream b, int64_t n) {
  if (out.bf16) {
    backend.scalar_mix(out.bf16, wa, a.bf16, wb, b.bf16, n);
  } else {
    backend.scalar_mix(out.f32, wa, a.f32, wb, b.f32, n);
  }
}

void mix_stream_backward(core::Backend& backend, float* da, float* db, float* dwa, float* dwb,
                         const float* wa, Stream a, const float* wb, Stream b, const float* dout,
                         int64_t n) {
  if (a.bf16) {
    backend.scalar_mix_backward(da, db, dwa, dwb, wa, a.bf16, wb, b.bf16, dout, n);
  } else {
    backend.scalar_mix_backward(da, db, dwa, dwb, wa, a.f32, wb, b.f32, dout, n);
  }
}

}  // namespace model
