// AdamW's own device op: the fused update of one tensor, m, v and w in place from g, so a step
// issues one kernel per tensor. Element math in adamw_math.h, shared by the cpu/ and cuda/
// implementations; make_adamw_ops picks one from the backend's device. Pointers are in that
// backend's memory.
#pragma once

#include <cstdint>
#include <memory>

#include "core/backend.h"
#include "optim/adamw/adamw_math.h"

namespace optim {

class AdamWOps {
 public:
  virtual ~AdamWOps() = default;
  // Fused AdamW over n elements (kmath::adamw_element): m, v and w updated in place from g.
  virtual void update(float* w, float* m, float* v, const float* g, int64_t n,
                      const kmath::AdamWStep& step) = 0;
};

// The ops for `backend`'s device; they run in its stream order.
std::unique_ptr<AdamWOps> make_adamw_ops(core::Backend& backend);

// The implementations make_adamw_ops chooses from (cpu/adamw_ops.cpp, cuda/adamw_ops.cu).
std::unique_ptr<AdamWOps> make_cpu_adamw_ops(core::Backend& backend);
std::unique_ptr<AdamWOps> make_cuda_adamw_ops(core::Backend& backend);

}  // namespace optim
