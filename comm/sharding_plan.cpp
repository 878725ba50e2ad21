#include "comm/sharding_plan.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <unordered_set>

#include "core/check.h"

namespace comm {

ShardingPlan::ShardingPlan(std::vector<ParamDesc> params, int world_size, int rank, int stage)
    : params_(std::move(params)), world_size_(world_size), rank_(rank), stage_(stage) {
  ENGINE_CHECK(world_size > 0, "ShardingPlan: world size " + std::to_string(world_size));
  ENGINE_CHECK(rank >= 0 && rank < world_size, "ShardingPlan: rank " + std::to_string(rank) +
                                                   " outside [0, " + std::to_string(world_size) +
                                                   ")");
  ENGINE_CHECK(stage >= 0 && stage <= 3,
               "ShardingPlan: ZeRO stage " + std::to_string(stage) + " (expected 0, 1, 2 or 3)");
  const size_t n = params_.size();
  placements_.resize(n);
  counts_.assign(n, std::vector<int64_t>(world_size, 0));
  std::unordered_set<std::string> names;
  std::vector<int64_t> load(world_size, 0);
  std::vector<size_t> auto_owned;

  for (size_t i = 0; i < n; ++i) {
    const ParamDesc& p = params_[i];
    ENGINE_CHECK(names.insert(p.name).second, "ShardingPlan: parameter " + p.name + " twice");
    for (int64_t d : p.shape) {
      ENGINE_CHECK(d >= 0, "ShardingPlan: parameter " + p.name + " has negative size in " +
                               core::shape_str(p.shape));
    }
    Placement pl = stage == 0 ? Placement::replicate() : p.placement;
    const int64_t total = core::shape_numel(p.shape);
    switch (pl.kind) {
      case Placement::Kind::Replicate:
        for (int r = 0; r < world_size; ++r)
          counts_[i][r] = total;
        break;
      case Placement::Kind::Shard: {
        ENGINE_CHECK(pl.dim >= 0 && pl.dim < static_cast<int>(p.shape.size()),
                     "ShardingPlan: parameter " + p.name + " " + core::shape_str(p.shape) +
                         " cannot be Shard(" + std::to_string(pl.dim) + ")");
        const int64_t extent = p.shape[pl.dim];
        const int64_t per_index = extent == 0 ? 0 : total / extent;
        for (int r = 0; r < world_size; ++r) {
          counts_[i][r] = shard_range(extent, world_size, r).size() * per_index;
          load[r] += counts_[i][r];
        }
        break;
      }
      case Placement::Kind::Owned:
        if (pl.owner == Placement::kAutoOwner) {
          auto_owned.push_back(i);
        } else {
          ENGINE_CHECK(pl.owner >= 0 && pl.owner < world_size,
                       "ShardingPlan: parameter " + p.name + " requests " + pl.str() +
                           " but the group has " + std::to_string(world_size) + " ranks");
          counts_[i][pl.owner] = total;
          load[pl.owner] += total;
        }
        break;
    }
    placements_[i] = pl;
  }

  // Balance the automatic owners: largest first onto the least loaded rank.
  std::stable_sort(auto_owned.begin(), auto_owned.end(),
                   [&](size_t a, size_t b) { return numel(a) > numel(b); });
  for (size_t i : auto_owned) {
    int best = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    placements_[i].owner = best;
    counts_[i][best] = numel(i);
    load[best] += numel(i);
  }
}

size_t ShardingPlan::index(const std::string& name) const {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].name == name) return i;
  }
  ENGINE_FAIL("ShardingPlan: no parameter named " + name);
}

ShardingPlan::LocalSlice ShardingPlan::local_slice(size_t i, int r) const {
  ENGINE_CHECK(r >= 0 && r < world_size_, "ShardingPlan::local_slice: rank " + std::to_string(r));
  const ParamDesc& p = params_.at(i);
  const Placement& pl = placements_[i];
  LocalSlice s;
  s.dim = pl.is_shard() ? pl.dim : 0;
  const int64_t extent = p.shape.empty() ? 1 : p.shape[s.dim];
  switch (pl.kind) {
    case Placement::Kind::Replicate:
      s.range = {0, extent};
      break;
    case Placement::Kind::Shard:
      s.range = shard_range(extent, world_size_, r);
      break;
    case Placement::Kind::Owned:
      s.range = r == pl.owner ? Range{0, extent} : Range{0, 0};
      break;
  }
  return s;
}

core::Shape ShardingPlan::local_shape(size_t i, int r) const {
  const ParamDesc& p = params_.at(i);
  const Placement& pl = placements_[i];
  core::Shape shape = p.shape;
  if (pl.is_replicate()) return shape;
  if (shape.empty()) return r == pl.owner ? shape : core::Shape{0};  // Owned scalar
  const LocalSlice s = local_slice(i, r);
  shape[s.dim] = s.range.size();
  return shape;
}

int64_t ShardingPlan::state_numel(int r) const {
  int64_t total = 0;
  for (size_t i = 0; i < params_.size(); ++i)
    total += counts_[i].at(r);
  return total;
}

std::vector<size_t> ShardingPlan::layer_params(int layer) const {
  std::vector<size_t> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].layer == layer) out.push_back(i);
  }
  return out;
}

std::vector<int> ShardingPlan::layers() const {
  std::set<int> seen;
  for (const ParamDesc& p : params_)
    seen.insert(p.layer);
  return {seen.begin(), seen.end()};
}

std::string ShardingPlan::describe() const {
  std::string out = "sharding plan: stage " + std::to_string(stage_) + ", " +
                    std::to_string(world_size_) + " ranks, rank " + std::to_string(rank_) + "\n";
  for (size_t i = 0; i < params_.size(); ++i) {
    out += "  " + params_[i].name + " " + core::shape_str(params_[i].shape) + " " +
           placements_[i].str() + " local " + core::shape_str(local_shape(i)) + "\n";
  }
  return out;
}

}  // namespace comm
