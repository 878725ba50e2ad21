// OptimizerSet: the parameter groups of a config, each with its own optimizer instance.
//
// YAML: an ordered list of groups
//   - params: ["blocks.*.attn.*.weight", "blocks.*.mlp.*.weight"]   # globs
//     optimizer: muon
//     lr: 0.05            # the optimizer's hyperparameters, lr_mul / wd_mul included
// Each parameter joins the FIRST group with a matching glob; a parameter matching no group is
// an error listing all unmatched ones, and so is a group whose globs name no parameter at all,
// or one left with none because a single earlier group took every parameter it names (unless
// the group says `optional: true`). Steps, placements and state go through the group.
//
// `update_every: k` (default 1) steps a group once every k steps, on the gradients of those k
// steps summed (record #89 steps its Adam parameters every other step: its step s, counted from
// 0, updates them when s is odd, with the two steps' gradients accumulated and that step's lr).
// Here the 1-based step t updates when t % k == 0; the steps between add their (scaled)
// gradients into an accumulator kept per parameter part, saved with the state as
// "<param>/update_every_grad". The gradients are still reduced every step: the record reduces
// them only on its update steps, the same sum in another order.
//
// `tied_to: P` with `untie_step: N` (a group of one parameter E, of P's shape and placement)
// ties E to P up to step N (0: the whole run), as record #89 ties its embedding to its head
// until its split step: while tied, E's gradient is added into P's before P's group steps, E's
// group does not step it, and after the step E's part is set to P's. At step N, after its
// update, P's optimizer state (moments, step counter) is carried into E's optimizer, and from
// step N + 1 on the two train apart. The record stores its head transposed ([D, V]) and so
// transposes the state it carries; here both are [Vp, D] and it is a copy. The record starts E
// equal to P (embed = lm_head^T at init): the model's initial values must agree.
#pragma once

#include <yaml-cpp/yaml.h>

#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/param_desc.h"
#include "optim/optimizer.h"
#include "optim/registry.h"

namespace optim {

class OptimizerSet {
 public:
  // Groups the parameters (their names and shapes) per `groups`.
  OptimizerSet(const YAML::Node& groups, std::span<const comm::ParamDesc> params,
               const Registry& registry = Registry::global());

  size_t num_groups() const { return groups_.size(); }
  Optimizer& optimizer(size_t group) const { return *groups_.at(group).optimizer; }
  const std::vector<std::string>& group_params(size_t group) const {
    return groups_.at(group).params;
  }
  // Makes `alias` (a tensor a reparametrisation puts in place of parameter `name`, e.g. an OSFT
  // factor) train in the group of `name`.
  void add_alias(const std::string& alias, const std::string& name);
  // Index of the group stepping `name`; an unknown name is an error.
  size_t group_of(const std::string& name) const;
  comm::Placement placement(const std::string& name) const {
    return optimizer(group_of(name)).placement();
  }
  // Whether the optimizer of `name`'s group scales its gradient itself (folds_grad_scale).
  bool folds_grad_scale(const std::string& name) const {
    return optimizer(group_of(name)).folds_grad_scale();
  }

  // Steps every given local part through its group's optimizer (one call per group with
  // parameters, in group order, parameters in the order given; a group none of whose parameters
  // this rank holds steps an empty list). ctx.grad_scale reaches only the groups whose optimizer
  // folds it.
  void step(std::span<const ParamShard> local, const StepContext& ctx);

  // All groups' state; load distributes keys "<param>/<slot>" to the parameter's group (a key
  // naming no parameter of this set is an error).
  OptimizerState state() const;
  void load_state(const OptimizerState& state);
  // The layout the optimizer of `param`'s group keeps `slot` in (Optimizer::state_layout).
  // The accumulator of update_every (kAccumulatedSlot) lies like the parameter's local part.
  std::optional<StateLayout> state_layout(const std::string& param, const std::string& slot,
                                          const core::Shape& full_shape, int rank,
                                          int world) const {
    if (slot == kAccumulatedSlot) return std::nullopt;
    return optimizer(group_of(param)).state_layout(param, slot, full_shape, rank, world);
  }
  // The state slot of update_every's accumulated gradient.
  static constexpr const char* kAccumulatedSlot = "update_every_grad";

 private:
  struct Group {
    std::vector<std::string> globs;
    std::unique_ptr<Optimizer> optimizer;
    std::vector<std::string> params;
    bool optional = false;  // may match no parameter (a preset shared by several model shapes)
    int64_t update_every = 1;
    std::string tied_to;     // the parameter this group's one parameter is tied to, or ""
    int64_t untie_step = 0;  // the last tied step (0: never untied)
  };
  // While a tie holds, adds the tied parameter's gradient into its target's and drops it from
  // `by_group`; after the step the caller copies the target's values (finish_ties).
  void begin_ties(std::span<const ParamShard> local, std::vector<std::vector<ParamShard>>& by_group,
                  const StepContext& ctx) const;
  void finish_ties(std::span<const ParamShard> local, const StepContext& ctx);
  // Adds a group's gradients of this step into its accumulators (the first step of a window
  // copies) and, on its update step, steps it on them.
  void step_accumulated(size_t group, std::span<const ParamShard> shards, const StepContext& ctx);

  std::vector<Group> groups_;
  std::map<std::string, size_t> group_of_;
  std::map<std::string, core::Tensor> accumulated_;  // update_every's, by parameter
};

}  // namespace optim
