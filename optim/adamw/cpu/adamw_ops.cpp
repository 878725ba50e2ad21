// AdamW's op on the CPU: adamw_math.h over the elements, tensor by tensor, OpenMP threads above the
// size where a parallel region pays (every element is independent, so the bits do not depend on
// the threads).
// The loop vectorises (without errno semantics, as the rest of engine_optim: vsqrtpd and vdivpd
// on AVX-512). Square root and division are correctly rounded in either form, so the bits are
// the scalar loop's (UpdateOps.AdamWUpdateIsTheHostLoopBitForBit against a loop built with errno,
// the golden replays); the step is about 4x faster (bench_optim --only =adamw). The loop reads
// locals, not the tensor's fields: inside the OpenMP region the fields are read through a
// reference that the float stores might alias, so they were reloaded each element, about 5x
// slower (16 M elements: 51 ms against about 10, bench_model --op-groups).
#include <string>

#include "core/check.h"
#include "core/cpu/parallel_loops.h"
#include "optim/adamw/adamw_ops.h"

namespace optim {

namespace {

class CpuAdamWOps final : public AdamWOps {
 public:
  void update(std::span<const AdamWTensor> tensors) override {
    for (const AdamWTensor& t : tensors) {
      // g * scale in float, as the trainer's scaling pass would have left it.
      const float scale = t.g_scale ? *t.g_scale : 1.0f;
      float *w = t.w, *m = t.m, *v = t.v;
      const float* g = t.g;
      const int64_t n = t.n;
      const kmath::AdamWStep step = t.step;
#pragma omp parallel for simd schedule(static) if (n > core::cpu::kParallelMin)
      for (int64_t i = 0; i < n; ++i)
        kmath::adamw_element(w[i], m[i], v[i], g[i] * scale, step);
    }
  }
};

}  // namespace

std::unique_ptr<AdamWOps> make_cpu_adamw_ops(core::Backend& backend) {
  ENGINE_CHECK(backend.device().is_cpu(),
               std::string("the CPU AdamW ops need the CPU backend, got ") + backend.name());
  return std::make_unique<CpuAdamWOps>();
}

}  // namespace optim
