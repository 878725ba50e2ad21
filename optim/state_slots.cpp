#include "optim/state_slots.h"

#include <algorithm>

#include "core/check.h"
#include "core/transfer.h"

namespace optim {

namespace {

// Moves host `state` (key `key`, for errors) into `backend`'s memory unless it is there already
// (host state read from a checkpoint, stepped on a device); state on another device is an error.
void on_backend(core::Tensor& state, const std::string& key, core::Backend& backend) {
  try {
    state = core::to_backend(backend, state);
  } catch (const core::Error& e) {
    ENGINE_FAIL("optimizer state '" + key + "': " + e.what());
  }
}

}  // namespace

StateSlots::StateSlots(std::string owner, std::vector<std::string> tensor_slots,
                       std::vector<std::string> counter_slots)
    : owner_(std::move(owner)),
      tensor_slots_(std::move(tensor_slots)),
      counter_slots_(std::move(counter_slots)) {}

core::Tensor& StateSlots::tensor(const std::string& param, const std::string& slot,
                                 const core::Shape& shape, core::Backend& backend, bool* created) {
  check_declared(param + "/" + slot, tensor_slots_, "state tensor");
  const std::string key = param + "/" + slot;
  auto it = tensors_.find(key);
  if (created) *created = it == tensors_.end();
  if (it == tensors_.end()) {
    core::Tensor t = core::Tensor::empty(shape, core::DType::F32, backend.allocator());
    backend.fill_zero(t.raw_data(), t.nbytes());
    it = tensors_.emplace(key, std::move(t)).first;
  }
  ENGINE_CHECK(it->second.shape() == shape,
               owner_ + ": optimizer state '" + key + "' has shape " +
                   core::shape_str(it->second.shape()) + " but " + core::shape_str(shape) +
                   " is needed (was it saved with another world size, placement or setting?)");
  on_backend(it->second, key, backend);
  return it->second;
}

int64_t& StateSlots::counter(const std::string& param, const std::string& name) {
  check_declared(param + "/" + name, counter_slots_, "state counter");
  return counters_[param + "/" + name];
}

void StateSlots::save(OptimizerState& out) const {
  for (const auto& [key, t] : tensors_)
    out.tensors[key] = t.clone();
  for (const auto& [key, n] : counters_)
    out.counters[key] = n;
}

void StateSlots::load(const OptimizerState& in) {
  tensors_.clear();
  counters_.clear();
  for (const auto& [key, t] : in.tensors) {
    check_declared(key, tensor_slots_, "state tensor");
    tensors_[key] = t.clone();
  }
  for (const auto& [key, n] : in.counters) {
    check_declared(key, counter_slots_, "state counter");
    counters_[key] = n;
  }
}

void StateSlots::check_declared(const std::string& key, const std::vector<std::string>& names,
                                const char* what) const {
  const size_t slash = key.rfind('/');
  const std::string slot = slash == std::string::npos ? key : key.substr(slash + 1);
  ENGINE_CHECK(slash != std::string::npos && slash > 0 &&
                   std::find(names.begin(), names.end(), slot) != names.end(),
               owner_ + ": unknown " + what + " '" + key + "'");
}

}  // namespace optim
