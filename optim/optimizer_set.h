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
  std::optional<StateLayout> state_layout(const std::string& param, const std::string& slot,
                                          const core::Shape& full_shape, int rank,
                                          int world) const {
    return optimizer(group_of(param)).state_layout(param, slot, full_shape, rank, world);
  }

 private:
  struct Group {
    std::vector<std::string> globs;
    std::unique_ptr<Optimizer> optimizer;
    std::vector<std::string> params;
    bool optional = false;  // may match no parameter (a preset shared by several model shapes)
  };
  std::vector<Group> groups_;
  std::map<std::string, size_t> group_of_;
};

}  // namespace optim
