#include "model/param_store.h"

#include <utility>

#include "core/check.h"
#include "core/transfer.h"

namespace model {

ParamStore::ParamStore(const ModelConfig& config, core::Backend& backend)
    : table_(config), backend_(backend), bf16_(config.precision == Precision::Bf16) {
  params_ = core::Tensor::empty({table_.total_numel()}, core::DType::F32, backend_.allocator());
  grads_ = core::Tensor::empty({table_.total_numel()}, core::DType::F32, backend_.allocator());
  backend_.fill_zero(params_.raw_data(), params_.nbytes());
  backend_.fill_zero(grads_.raw_data(), grads_.nbytes());
  for (size_t i = 0; i < table_.size(); ++i) {
    const ParamInfo& p = table_[i];
    param_view_.push_back(params_.slice(0, p.offset, p.numel).view(p.shape));
    grad_view_.push_back(grads_.slice(0, p.offset, p.numel).view(p.shape));
  }
  has_bf16_copy_.assign(table_.size(), false);
  bf16_copy_.resize(table_.size());
  bf16_copy_fresh_.assign(table_.size(), false);
}

size_t ParamStore::index(const std::string& name) const {
  auto i = table_.find(name);
  ENGINE_CHECK(i.has_value(), "model has no parameter named '" + name + "'");
  return *i;
}

size_t ParamStore::find(const std::string& name) const {
  return table_.find(name).value_or(kNoParam);
}

const float* ParamStore::value(size_t i) const {
  if (i == kNoParam) return nullptr;
  ENGINE_CHECK(param_view_[i].defined(), "model: parameter " + table_[i].name + " is not bound");
  return param_view_[i].data<float>();
}

float* ParamStore::grad_of(size_t i) const {
  if (i == kNoParam) return nullptr;
  ENGINE_CHECK(grad_view_[i].defined(),
               "model: the gradient of " + table_[i].name + " is not bound");
  return grad_view_[i].data<float>();
}

void ParamStore::use_in_bf16_gemm(size_t i) {
  has_bf16_copy_.at(i) = true;
}

Operand ParamStore::weight(size_t i) {
  if (!bf16_ || !has_bf16_copy_[i]) return {value(i), nullptr};
  const float* v = value(i);
  const core::Tensor& p = param_view_[i];
  core::Tensor& copy = bf16_copy_[i];
  if (!bf16_copy_fresh_[i]) {
    if (!copy.defined())
      copy = core::Tensor::empty(p.shape(), core::DType::BF16, backend_.allocator());
    backend_.f32_to_bf16(copy.data<core::bf16>(), v, p.numel());
    bf16_copy_fresh_[i] = true;
  }
  return {v, copy.data<core::bf16>()};
}

void ParamStore::release_storage() {
  for (size_t i = 0; i < table_.size(); ++i) {
    param_view_[i] = core::Tensor();
    grad_view_[i] = core::Tensor();
    bf16_copy_[i] = core::Tensor();
    bf16_copy_fresh_[i] = false;
  }
  params_ = core::Tensor();
  grads_ = core::Tensor();
}

void ParamStore::bind_param(size_t i, core::Tensor v) {
  ENGINE_CHECK(
      !v.defined() || v.shape() == table_[i].shape,
      "model: binding " + table_[i].name + " to a tensor of shape " + core::shape_str(v.shape()));
  // A new binding (ZeRO stage 3 gathers a layer before use) needs a new bf16 copy; an unbound
  // parameter's copy is freed with it.
  if (!v.defined()) bf16_copy_.at(i) = core::Tensor();
  bf16_copy_fresh_.at(i) = false;
  param_view_.at(i) = std::move(v);
}

void ParamStore::bind_grad(size_t i, core::Tensor g) {
  ENGINE_CHECK(!g.defined() || g.shape() == table_[i].shape,
               "model: binding the gradient of " + table_[i].name + " to a tensor of shape " +
                   core::shape_str(g.shape()));
  grad_view_.at(i) = std::move(g);
}

void ParamStore::init_weights(uint64_t seed) {
  ENGINE_CHECK(params_.defined(), "model: init_weights needs the flat parameter buffer");
  core::Tensor host = core::Tensor::empty({table_.total_numel()});
  for (size_t i = 0; i < table_.size(); ++i) {
    const ParamInfo& p = table_[i];
    table_.init_host(i, host.slice(0, p.offset, p.numel), seed);
  }
  core::write_from_host(backend_, params_, host);
  params_updated();
}

void ParamStore::params_updated() {
  bf16_copy_fresh_.assign(table_.size(), false);
}

void ParamStore::zero_grad() {
  if (grads_.defined()) {
    backend_.fill_zero(grads_.raw_data(), grads_.nbytes());
    return;
  }
  for (const core::Tensor& t : grad_view_)
    if (t.defined()) backend_.fill_zero(t.raw_data(), t.nbytes());
}

}  // namespace model
