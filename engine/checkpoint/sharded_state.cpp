#include "engine/checkpoint/sharded_state.h"

#include "core/check.h"
#include "core/transfer.h"

namespace engine {

namespace {

constexpr std::string_view kParamPrefix = "param/";
constexpr std::string_view kOptimPrefix = "optim/";
constexpr std::string_view kCounterPrefix = "counter/";

// "<param>/<slot>" -> "<param>".
std::string param_of_state_key(const std::string& key) {
  return key.substr(0, key.rfind('/'));
}

// "<param>/<slot>" -> "<slot>".
std::string slot_of_state_key(const std::string& key) {
  return key.substr(key.rfind('/') + 1);
}

// The layout the optimizer of the key's parameter keeps state tensor `key` in, if its own.
std::optional<optim::StateLayout> layout_of(const optim::OptimizerSet& optimizers,
                                            const comm::ShardingPlan& plan, size_t i,
                                            const std::string& key) {
  return optimizers.state_layout(plan.param(i).name, slot_of_state_key(key), plan.param(i).shape,
                                 plan.rank(), plan.world_size());
}

std::string strip(const std::string& name, std::string_view prefix) {
  return name.substr(prefix.size());
}

bool starts_with(const std::string& name, std::string_view prefix) {
  return name.rfind(prefix, 0) == 0;
}

}  // namespace

std::string param_key(const std::string& name) {
  return std::string(kParamPrefix) + name;
}

void stage_to_host(RankState& state, core::Backend& backend) {
  for (SavedSlice& s : state.slices)
    s.local = core::to_host(backend, s.local);
}

RankState sharded_rank_state(const comm::ShardingPlan& plan,
                             std::span<const core::Tensor> local_values,
                             const optim::OptimizerSet& optimizers) {
  const int rank = plan.rank();
  // Replicate parts are whole on every rank: rank 0 saves them.
  auto saves = [&](size_t i) { return !plan.placement(i).is_replicate() || rank == 0; };
  RankState out;
  for (size_t i = 0; i < plan.num_params(); ++i) {
    if (!local_values[i].defined() || !saves(i)) continue;
    const comm::ShardingPlan::LocalSlice s = plan.local_slice(i);
    out.slices.push_back({param_key(plan.param(i).name), plan.param(i).shape, s.dim, s.range.begin,
                          local_values[i]});
  }
  const optim::OptimizerState optimizer_state = optimizers.state();
  for (const auto& [key, t] : optimizer_state.tensors) {
    const size_t i = plan.index(param_of_state_key(key));
    const std::string name = std::string(kOptimPrefix) + key;
    if (const auto layout = layout_of(optimizers, plan, i, key)) {
      ENGINE_CHECK(t.shape() == layout->local_shape(),
                   "checkpoint: optimizer state " + key + " has shape " +
                       core::shape_str(t.shape()) + ", its optimizer's layout says " +
                       core::shape_str(layout->local_shape()));
      if (!layout->replicated)
        out.slices.push_back({name, layout->global_shape, layout->dim, layout->begin, t});
      else if (rank == 0)
        out.slices.push_back({name, layout->global_shape, 0, 0, t});
      continue;
    }
    if (!saves(i)) continue;
    if (t.shape() == plan.local_shape(i)) {
      const comm::ShardingPlan::LocalSlice s = plan.local_slice(i);
      out.slices.push_back({name, plan.param(i).shape, s.dim, s.range.begin, t});
    } else {
      ENGINE_CHECK(!plan.placement(i).is_shard(),
                   "checkpoint: optimizer state " + key + " of shape " +
                       core::shape_str(t.shape()) +
                       " is not shaped like its parameter's local part " +
                       core::shape_str(plan.local_shape(i)));
      out.slices.push_back({name, t.shape(), 0, 0, t});
    }
  }
  for (const auto& [key, v] : optimizer_state.counters)
    out.counters[std::string(kCounterPrefix) + key] = v;
  return out;
}

void read_local_params(const CheckpointReader& reader, const comm::ShardingPlan& plan,
                       std::span<const core::Tensor> local_values, core::Backend& backend) {
  for (size_t i = 0; i < plan.num_params(); ++i) {
    const std::string& name = plan.param(i).name;
    const std::string key = param_key(name);
    ENGINE_CHECK(reader.has(key), "checkpoint " + reader.dir() + " has no parameter " + name);
    ENGINE_CHECK(reader.global_shape(key) == plan.param(i).shape,
                 "checkpoint " + reader.dir() + ": parameter " + name + " has shape " +
                     core::shape_str(reader.global_shape(key)) + ", the model expects " +
                     core::shape_str(plan.param(i).shape));
    if (!local_values[i].defined()) continue;
    const comm::ShardingPlan::LocalSlice s = plan.local_slice(i);
    const core::Tensor& local = local_values[i];
    ENGINE_CHECK(local.is_contiguous(), "checkpoint " + reader.dir() + ": the local part of " +
                                            name + " is not contiguous");
    core::Tensor host = core::Tensor::empty(local.shape());
    reader.read(key, s.dim, s.range.begin, host);
    core::write_from_host(backend, local, host);
  }
}

optim::OptimizerState read_optimizer_state(const CheckpointReader& reader,
                                           const comm::ShardingPlan& plan,
                                           std::span<const core::Tensor> local_values,
                                           const optim::OptimizerSet& optimizers) {
  optim::OptimizerState state;
  for (const SliceInfo& slice : reader.manifest().slices) {
    if (!starts_with(slice.name, kOptimPrefix)) continue;
    const std::string key = strip(slice.name, kOptimPrefix);
    if (state.tensors.count(key)) continue;  // one entry per saved slice of a tensor
    const size_t i = plan.index(param_of_state_key(key));
    if (!local_values[i].defined()) continue;
    if (const auto layout = layout_of(optimizers, plan, i, key)) {
      ENGINE_CHECK(reader.global_shape(slice.name) == layout->global_shape,
                   "checkpoint " + reader.dir() + ": optimizer state " + key + " has shape " +
                       core::shape_str(reader.global_shape(slice.name)) +
                       ", its optimizer keeps it as " + core::shape_str(layout->global_shape));
      if (layout->replicated) {
        state.tensors[key] = reader.read_full(slice.name);
      } else {
        core::Tensor t = core::Tensor::empty(layout->local_shape());
        reader.read(slice.name, layout->dim, layout->begin, t);
        state.tensors[key] = t;
      }
    } else if (reader.global_shape(slice.name) == plan.param(i).shape) {
      core::Tensor t = core::Tensor::empty(plan.local_shape(i));
      const comm::ShardingPlan::LocalSlice s = plan.local_slice(i);
      reader.read(slice.name, s.dim, s.range.begin, t);
      state.tensors[key] = t;
    } else {
      state.tensors[key] = reader.read_full(slice.name);
    }
  }
  for (const auto& [name, v] : reader.manifest().counters) {
    const std::string key = strip(name, kCounterPrefix);
    if (local_values[plan.index(param_of_state_key(key))].defined()) state.counters[key] = v;
  }
  return state;
}

}  // namespace engine
