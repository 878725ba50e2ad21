// The step context the optimizer unit tests step with: the CPU backend (a context without a
// backend is refused).
#pragma once

#include "core/backend.h"
#include "optim/optimizer.h"

inline optim::StepContext cpu_context() {
  optim::StepContext ctx;
  ctx.backend = &core::cpu_backend();
  return ctx;
}
