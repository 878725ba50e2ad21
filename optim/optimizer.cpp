#include "optim/optimizer.h"

#include "core/check.h"
#include "core/transfer.h"

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

core::Tensor& state_tensor(std::map<std::string, core::Tensor>& slots, const std::string& name,
                           const char* slot, const core::Tensor& like, core::Backend& backend) {
  const std::string key = name + "/" + slot;
  auto it = slots.find(key);
  if (it == slots.end()) {
    core::Tensor t = core::Tensor::empty(like.shape(), core::DType::F32, backend.allocator());
    backend.fill_zero(t.raw_data(), t.nbytes());
    it = slots.emplace(key, std::move(t)).first;
  }
  ENGINE_CHECK(it->second.shape() == like.shape(),
               "optimizer state '" + key + "' has shape " + core::shape_str(it->second.shape()) +
                   " but the local part of the parameter is " + core::shape_str(like.shape()) +
                   " (was it saved with another world size or placement?)");
  on_backend(it->second, key, backend);
  return it->second;
}

void on_backend(core::Tensor& state, const std::string& key, core::Backend& backend) {
  try {
    state = core::to_backend(backend, state);
  } catch (const core::Error& e) {
    ENGINE_FAIL("optimizer state '" + key + "': " + e.what());
  }
}

}  // namespace optim
