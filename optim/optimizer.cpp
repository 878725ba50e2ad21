#include "optim/optimizer.h"

#include "core/check.h"

namespace optim {

StateLayout StateLayout::whole(core::Shape shape) {
  StateLayout l;
  l.size = shape.empty() ? 1 : shape[0];
  l.global_shape = std::move(shape);
  l.replicated = true;
  return l;
}

StateLayout StateLayout::part(core::Shape shape, int dim, int rank, int world) {
  StateLayout l;
  l.dim = dim;
  l.size = shape.at(static_cast<size_t>(dim)) / world;
  l.begin = rank * l.size;
  l.global_shape = std::move(shape);
  return l;
}

core::Shape StateLayout::local_shape() const {
  core::Shape s = global_shape;
  if (!s.empty()) s[static_cast<size_t>(dim)] = size;
  return s;
}

core::Backend& backend_of(const StepContext& ctx) {
  // The caller chose the device; an optimizer never picks one on its own.
  ENGINE_CHECK(ctx.backend != nullptr,
               "optimizer step " + std::to_string(ctx.step) + ": the StepContext names no backend");
  return *ctx.backend;
}

void check_shard(const ParamShard& p, const char* who) {
  const std::string what = std::string(who) + ": parameter '" + p.name + "'";
  ENGINE_CHECK(p.value.defined() && p.grad.defined(), what + " has no value or no gradient");
  ENGINE_CHECK(p.value.dtype() == core::DType::F32 && p.grad.dtype() == core::DType::F32,
               what + " must be f32, got " + p.value.str() + " / " + p.grad.str());
  ENGINE_CHECK(p.value.is_contiguous() && p.grad.is_contiguous(), what + " must be contiguous");
  ENGINE_CHECK(p.value.shape() == p.grad.shape(),
               what + ": value " + p.value.str() + " and gradient " + p.grad.str() + " differ");
}

}  // namespace optim
