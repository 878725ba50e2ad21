// AdamW's own device op: the fused update of many tensors, m, v and w in place from g, so a step
// issues one kernel for all the tensors it updates (multi-tensor apply). Element math in
// adamw_math.h, shared by the cpu/ and cuda/ implementations; make_adamw_ops picks one from the
// backend's device. Pointers are in that backend's memory.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "core/backend.h"
#include "optim/adamw/adamw_math.h"

namespace optim {

// One tensor of an update: n elements of w, m, v and g, and its step's scalars.
struct AdamWTensor {
  float* w = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  const float* g = nullptr;
  int64_t n = 0;
  kmath::AdamWStep step;
  const float* g_scale = nullptr;  // the gradient is g * *g_scale (on the device); nullptr: g
};

class AdamWOps {
 public:
  virtual ~AdamWOps() = default;
  // Fused AdamW over every tensor: m, v and w updated in place from g (times *g_scale). The CPU
  // runs kmath::adamw_element (float64 arithmetic, the golden trajectories' contract), a device
  // kmath::adamw_element_f32 (float arithmetic, within a few float ulps a step). The tensors
  // must not overlap.
  virtual void update(std::span<const AdamWTensor> tensors) = 0;
};

// The ops for `backend`'s device; they run in its stream order.
std::unique_ptr<AdamWOps> make_adamw_ops(core::Backend& backend);

// The implementations make_adamw_ops chooses from (cpu/adamw_ops.cpp, cuda/adamw_ops.cu).
std::unique_ptr<AdamWOps> make_cpu_adamw_ops(core::Backend& backend);
std::unique_ptr<AdamWOps> make_cuda_adamw_ops(core::Backend& backend);

}  // namespace optim
