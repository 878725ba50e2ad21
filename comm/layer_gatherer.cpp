#include "comm/layer_gatherer.h"

#include <string>

#include "comm/composite_work.h"
#include "comm/shard_ops.h"
#include "core/check.h"

namespace comm {

LayerGatherer::LayerGatherer(Communicator& comm, const ShardingPlan& plan,
                             core::Allocator& allocator)
    : comm_(comm), plan_(plan), allocator_(allocator), local_(plan.num_params()) {}

void LayerGatherer::set_local(size_t i, core::Tensor local) {
  ENGINE_CHECK(i < local_.size(),
               "LayerGatherer::set_local: parameter index " + std::to_string(i) + " out of range");
  if (local.defined()) {
    ENGINE_CHECK(local.shape() == plan_.local_shape(i),
                 "LayerGatherer: local part of " + plan_.param(i).name + " on rank " +
                     std::to_string(plan_.rank()) + " is " + core::shape_str(local.shape()) +
                     ", expected " + core::shape_str(plan_.local_shape(i)));
  }
  local_[i] = std::move(local);
}

const core::Tensor& LayerGatherer::local(size_t i) const {
  return local_.at(i);
}

std::unique_ptr<Work> LayerGatherer::gather_async(int layer) {
  ENGINE_CHECK(!is_gathered(layer), "LayerGatherer: layer " + std::to_string(layer) +
                                        " is already gathered on rank " +
                                        std::to_string(plan_.rank()));
  auto group = std::make_unique<WorkGroup>();
  std::map<size_t, core::Tensor> fulls;
  for (size_t i : plan_.layer_params(layer)) {
    if (plan_.placement(i).is_replicate()) {
      ENGINE_CHECK(local_[i].defined(), "LayerGatherer: no local tensor set for " +
                                            plan_.param(i).name + " on rank " +
                                            std::to_string(plan_.rank()));
      fulls[i] = local_[i];
      continue;
    }
    core::Tensor full = core::Tensor::empty(plan_.param(i).shape, core::DType::F32, allocator_);
    group->add(all_gather_param_async(comm_, plan_, i, local_[i], full));
    fulls[i] = std::move(full);
  }
  gathered_[layer] = std::move(fulls);  // only once every gather has started
  return group;
}

const core::Tensor& LayerGatherer::full(size_t i) const {
  const int layer = plan_.param(i).layer;
  auto it = gathered_.find(layer);
  ENGINE_CHECK(it != gathered_.end(), "LayerGatherer: " + plan_.param(i).name + " (layer " +
                                          std::to_string(layer) + ") is not gathered on rank " +
                                          std::to_string(plan_.rank()));
  return it->second.at(i);
}

void LayerGatherer::release(int layer) {
  auto it = gathered_.find(layer);
  ENGINE_CHECK(it != gathered_.end(), "LayerGatherer: release of layer " + std::to_string(layer) +
                                          " which is not gathered on rank " +
                                          std::to_string(plan_.rank()));
  gathered_.erase(it);
}

}  // namespace comm
