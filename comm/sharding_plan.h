// ShardingPlan: where every parameter's optimizer state, gradient and (at stage 3) value live.
//
// Built from the parameters' descriptors (name, shape, requested placement, layer), the shard-group
// size and the ZeRO stage; identical on every rank (a pure function of its inputs).
//   stage 0  plain data parallel: every placement becomes Replicate (all-reduced gradients).
//   stage 1  optimizer state only where the placement says; gradients all-reduced, each rank
//            keeps its part, updated parameters all-gathered.
//   stage 2  as 1, but gradients are reduce-scattered straight to their placement.
//   stage 3  as 2, and parameters rest as their local parts; full tensors exist only while a
//            layer is gathered (LayerGatherer).
// Replicate parameters are whole on every rank at every stage (all-reduce, replicated update).
// Shard(d) splits dimension d by shard_range; Owned(auto) owners are chosen greedily, largest
// tensor first, to the rank with the fewest elements to update so far (ties: lower index,
// lower rank), counting the shard parts too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/param_desc.h"
#include "comm/placement.h"
#include "core/tensor.h"

namespace comm {

class ShardingPlan {
 public:
  ShardingPlan(std::vector<ParamDesc> params, int world_size, int rank, int stage);

  int world_size() const { return world_size_; }
  int rank() const { return rank_; }
  int stage() const { return stage_; }
  size_t num_params() const { return params_.size(); }

  const ParamDesc& param(size_t i) const { return params_.at(i); }
  const Placement& placement(size_t i) const { return placements_.at(i); }
  // Index of a parameter by name; throws naming the parameter when absent.
  size_t index(const std::string& name) const;

  // Where rank r's local part of parameter i lies in the full tensor: indices `range` along
  // dimension `dim`, every other dimension whole. dim is the Shard dimension (0 for Owned and
  // Replicate); range is the shard range for Shard, the whole dimension or nothing for Owned,
  // the whole dimension for Replicate. A scalar counts as one index along dim 0.
  struct LocalSlice {
    int dim = 0;
    Range range;
  };
  LocalSlice local_slice(size_t i, int r) const;
  LocalSlice local_slice(size_t i) const { return local_slice(i, rank_); }
  Range range(size_t i, int r) const { return local_slice(i, r).range; }
  core::Shape local_shape(size_t i, int r) const;
  core::Shape local_shape(size_t i) const { return local_shape(i, rank_); }
  int64_t local_numel(size_t i, int r) const { return counts_.at(i).at(r); }
  int64_t local_numel(size_t i) const { return local_numel(i, rank_); }
  // Elements held by each rank (what reduce_scatter / all_gather move for this parameter).
  const std::vector<int64_t>& counts(size_t i) const { return counts_.at(i); }
  int64_t numel(size_t i) const { return core::shape_numel(params_.at(i).shape); }

  // Elements of optimizer work (state) rank r has, over all parameters.
  int64_t state_numel(int r) const;
  // Parameter indices of one layer, in table order; the layers present, ascending.
  std::vector<size_t> layer_params(int layer) const;
  std::vector<int> layers() const;

  // One line per parameter: name, shape, placement, this rank's local shape.
  std::string describe() const;

 private:
  std::vector<ParamDesc> params_;
  std::vector<Placement> placements_;         // resolved
  std::vector<std::vector<int64_t>> counts_;  // [param][rank] local elements
  int world_size_;
  int rank_;
  int stage_;
};

}  // namespace comm
