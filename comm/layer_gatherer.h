// LayerGatherer: ZeRO stage 3 parameter residency. Parameters rest as this rank's local parts;
// gather(layer) all-gathers the full tensors of one layer's parameters into buffers from the
// allocator, release(layer) frees them. Several layers may be gathered at once (prefetching the
// next layer while the current one computes); Replicate parameters are used in place.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "comm/sharding_plan.h"
#include "core/tensor.h"

namespace comm {

class LayerGatherer {
 public:
  // comm and plan must outlive the gatherer; full buffers come from `allocator`.
  LayerGatherer(Communicator& comm, const ShardingPlan& plan, core::Allocator& allocator);

  // The resting local part of parameter i (plan.local_shape(i)); kept by reference (shared
  // storage), so in-place optimizer updates are seen by the next gather.
  void set_local(size_t i, core::Tensor local);
  const core::Tensor& local(size_t i) const;

  // Starts the all-gathers of every parameter of `layer`; full(i) is valid after wait().
  std::unique_ptr<Work> gather_async(int layer);
  void gather(int layer) { gather_async(layer)->wait(); }
  bool is_gathered(int layer) const { return gathered_.count(layer) > 0; }
  // The full tensor of parameter i; its layer must be gathered.
  const core::Tensor& full(size_t i) const;
  // Frees the full buffers of `layer` (it must be gathered).
  void release(int layer);

 private:
  Communicator& comm_;
  const ShardingPlan& plan_;
  core::Allocator& allocator_;
  std::vector<core::Tensor> local_;
  std::map<int, std::map<size_t, core::Tensor>> gathered_;  // layer -> param -> full tensor
};

}  // namespace comm
