// Sharded state <-> checkpoint: which slices of the parameters and of the optimizer state this
// rank saves under the sharding plan, and reading them back into the local parts of any plan
// (any world size or stage: the checkpoint reader assembles a slice from whichever files hold
// it).
//
// Keys: "param/<name>" a parameter; "optim/<name>/<slot>" an optimizer state tensor;
// "counter/<name>/<counter>" an optimizer integer. A parameter's slice is this rank's local part
// (plan.local_slice). A state tensor shaped like its parameter's local part is saved as that
// slice of a tensor shaped like the parameter, so it reshards with it; any other state tensor
// (a whole-matrix optimizer's own shapes) belongs to an Owned or Replicate parameter and is
// saved whole by its holder. An optimizer that keeps a tensor in its own layout says so
// (Optimizer::state_layout: rows of a larger tensor, or replicated), and that layout is used
// instead. Replicate parts are saved by rank 0 only.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "comm/sharding_plan.h"
#include "core/backend.h"
#include "core/tensor.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "optim/optimizer_set.h"

namespace engine {

struct RankState {
  std::vector<SavedSlice> slices;
  std::map<std::string, int64_t> counters;
};

// The key of parameter `name` in a checkpoint: "param/<name>".
std::string param_key(const std::string& name);

// Checkpoint files are written and read through host memory whichever device holds the state,
// so a checkpoint written on GPUs is the same file as one written on CPUs (core/transfer.h).
// Every slice of `state` as a host tensor, ready for write_rank_file.
void stage_to_host(RankState& state, core::Backend& backend);

// This rank's part of a checkpoint: the local values (one per plan entry, undefined where this
// rank holds nothing) and the optimizer state of the parameters it holds (`optimizers` says
// the layout of each state tensor).
RankState sharded_rank_state(const comm::ShardingPlan& plan,
                             std::span<const core::Tensor> local_values,
                             const optim::OptimizerSet& optimizers);

// Fills every defined local value from the checkpoint (through a host buffer, copied into the
// backend's memory), after checking that it holds every parameter of the plan with the plan's shape
// (errors name the checkpoint and the parameter).
void read_local_params(const CheckpointReader& reader, const comm::ShardingPlan& plan,
                       std::span<const core::Tensor> local_values, core::Backend& backend);

// The optimizer state of the parameters whose local value is defined, shaped like their local
// parts (or whole, or in the layout their optimizer in `optimizers` gives, see the header
// comment), as host tensors: an optimizer moves its state into the memory it steps in on first
// use (optim::StateSlots).
optim::OptimizerState read_optimizer_state(const CheckpointReader& reader,
                                           const comm::ShardingPlan& plan,
                                           std::span<const core::Tensor> local_values,
                                           const optim::OptimizerSet& optimizers);

}  // namespace engine
