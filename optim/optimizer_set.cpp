#include "optim/optimizer_set.h"

#include <set>

#include "core/check.h"
#include "core/transfer.h"
#include "optim/glob.h"
#include "optim/hyper_reader.h"

namespace optim {

OptimizerSet::OptimizerSet(const YAML::Node& groups, std::span<const comm::ParamDesc> params,
                           const Registry& registry) {
  ENGINE_CHECK(groups.IsSequence(),
               "optimizer groups must be a list of maps (" + yaml_line(groups) + ")");
  for (size_t i = 0; i < groups.size(); ++i) {
    const YAML::Node g = groups[i];
    const std::string where = "optimizer group " + std::to_string(i);
    HyperReader reader(g, where);
    Group group;
    group.globs = reader.strings("params");
    const std::string name = reader.string("optimizer", "");
    if (name.empty()) reader.fail("", "missing 'optimizer'");
    group.optional = reader.boolean("optional", false);
    group.update_every = reader.integer("update_every", 1);
    if (group.update_every < 1) reader.fail("update_every", "must be >= 1");
    HyperReader hyper(g, where + " (" + name + ")");
    hyper.skip("params");
    hyper.skip("optimizer");
    hyper.skip("optional");
    hyper.skip("update_every");
    group.tied_to = reader.string("tied_to", "");
    group.untie_step = reader.integer("untie_step", 0);
    if (group.untie_step < 0) reader.fail("untie_step", "must be >= 0");
    if (group.tied_to.empty() && reader.has("untie_step"))
      reader.fail("untie_step", "needs tied_to (the parameter this group is tied to)");
    hyper.skip("tied_to");
    hyper.skip("untie_step");
    group.optimizer = registry.create(name, hyper);
    groups_.push_back(std::move(group));
  }
  std::vector<std::string> unmatched;
  for (const comm::ParamDesc& p : params) {
    size_t found = groups_.size();
    for (size_t i = 0; i < groups_.size() && found == groups_.size(); ++i)
      for (const std::string& glob : groups_[i].globs)
        if (glob_match(glob, p.name)) {
          found = i;
          break;
        }
    if (found == groups_.size()) {
      unmatched.push_back(p.name);
      continue;
    }
    ENGINE_CHECK(group_of_.emplace(p.name, found).second,
                 "optimizer groups: parameter '" + p.name + "' listed twice");
    try {
      groups_[found].optimizer->check_param(p.name, p.shape);
    } catch (const core::Error& e) {
      ENGINE_FAIL(std::string(e.what()) + " [optimizer group " + std::to_string(found) + ", " +
                  yaml_line(groups[found]) + "]");
    }
    groups_[found].params.push_back(p.name);
  }
  // A group none of whose globs names any parameter is a typo (or a config for another model):
  // refused rather than silently stepping nothing, unless it says `optional: true` (a preset
  // group for parameters only some model shapes have, e.g. lm_head.weight with an untied head).
  // Names claimed by an earlier group count as named.
  for (size_t i = 0; i < groups_.size(); ++i) {
    bool any = false;
    for (const comm::ParamDesc& p : params)
      for (const std::string& glob : groups_[i].globs)
        any = any || glob_match(glob, p.name);
    if (any || groups_[i].optional || params.empty()) continue;
    std::string globs, examples;
    for (const auto& g : groups_[i].globs)
      globs += (globs.empty() ? "'" : ", '") + g + "'";
    for (size_t k = 0; k < params.size() && k < 4; ++k)
      examples += (examples.empty() ? "" : ", ") + params[k].name;
    ENGINE_FAIL("optimizer group " + std::to_string(i) + " (" + yaml_line(groups[i]) +
                "): params " + globs +
                " match no parameter of this model (its parameters are "
                "named like " +
                examples + ", ...)");
  }
  // A group all of whose parameters went to one earlier group (first match wins) steps
  // nothing: its optimizer and hyperparameters silently never apply. That is a group listed
  // after a broader one, e.g. a group for the attention weights after a catch-all '*'. A group
  // left empty by several earlier groups is the "everything else" group of a config shared by
  // model shapes (tiny.yaml's '*' gets the biases and norms of gpt2, nothing of modern).
  for (size_t i = 0; i < groups_.size(); ++i) {
    if (!groups_[i].params.empty() || groups_[i].optional) continue;
    std::set<size_t> takers;
    std::string example;
    for (const comm::ParamDesc& p : params)
      for (const std::string& glob : groups_[i].globs)
        if (glob_match(glob, p.name)) {
          takers.insert(group_of_.at(p.name));
          if (example.empty()) example = p.name;
          break;
        }
    if (takers.size() != 1) continue;  // none: refused above (or optional); several: see above
    const size_t taker = *takers.begin();
    ENGINE_FAIL("optimizer group " + std::to_string(i) + " (" + yaml_line(groups[i]) +
                ") is left with no parameter: every parameter its params name (e.g. " + example +
                ") went to optimizer group " + std::to_string(taker) + " (" +
                yaml_line(groups[taker]) +
                ") listed before it, and the first matching group wins. Move it before that "
                "group, drop it, or mark it optional: true");
  }
  for (size_t i = 0; i < groups_.size(); ++i) {
    const Group& g = groups_[i];
    if (g.tied_to.empty()) continue;
    const std::string where = "optimizer group " + std::to_string(i) + " (" + yaml_line(groups[i]) +
                              "): tied_to '" + g.tied_to + "'";
    ENGINE_CHECK(g.params.size() == 1, where + " needs a group of exactly one parameter, it has " +
                                           std::to_string(g.params.size()));
    auto target = group_of_.find(g.tied_to);
    ENGINE_CHECK(target != group_of_.end(), where + " names no parameter of this model");
    ENGINE_CHECK(target->second != i, where + " is in the same group");
    const Group& t = groups_[target->second];
    ENGINE_CHECK(t.tied_to.empty(), where + " is itself tied");
    const auto shape_of = [&](const std::string& name) {
      for (const comm::ParamDesc& p : params)
        if (p.name == name) return p.shape;
      return core::Shape{};
    };
    ENGINE_CHECK(shape_of(g.params[0]) == shape_of(g.tied_to),
                 where + " has shape " + core::shape_str(shape_of(g.tied_to)) + ", '" +
                     g.params[0] + "' " + core::shape_str(shape_of(g.params[0])));
    ENGINE_CHECK(g.optimizer->placement() == t.optimizer->placement() &&
                     g.optimizer->folds_grad_scale() == t.optimizer->folds_grad_scale() &&
                     g.optimizer->kind() == std::string(t.optimizer->kind()),
                 where +
                     ": both groups must run the same optimizer kind (their state is carried "
                     "over at the untie step)");
    ENGINE_CHECK(g.untie_step % t.update_every == 0,
                 where + ": untie_step " + std::to_string(g.untie_step) +
                     " is not an update step of its group (update_every " +
                     std::to_string(t.update_every) + ")");
  }
  if (!unmatched.empty()) {
    std::string list;
    for (const auto& n : unmatched)
      list += (list.empty() ? "" : ", ") + n;
    ENGINE_FAIL("optimizer groups (" + yaml_line(groups) + "): no group matches " +
                std::to_string(unmatched.size()) + " parameter(s): " + list);
  }
}

void OptimizerSet::add_alias(const std::string& alias, const std::string& name) {
  const size_t group = group_of(name);
  ENGINE_CHECK(group_of_.emplace(alias, group).second,
               "optimizer groups: '" + alias + "' is already a parameter");
  groups_[group].params.push_back(alias);
}

size_t OptimizerSet::group_of(const std::string& name) const {
  auto it = group_of_.find(name);
  ENGINE_CHECK(it != group_of_.end(), "optimizer groups: unknown parameter '" + name + "'");
  return it->second;
}

void OptimizerSet::step(std::span<const ParamShard> local, const StepContext& ctx) {
  std::vector<std::vector<ParamShard>> by_group(groups_.size());
  for (const ParamShard& p : local)
    by_group[group_of(p.name)].push_back(p);
  // A group steps even where this rank holds none of its parameters: its optimizer may join
  // collectives that count every rank (the OSFT projection, when a small target's rows leave a
  // rank out).
  // The gradient scale goes only to an optimizer that folds it; the others' gradients arrive
  // scaled (an inner AdamW, as OSFT's, must not scale them again).
  StepContext unscaled = ctx;
  unscaled.grad_scale = nullptr;
  begin_ties(local, by_group, ctx);
  for (size_t i = 0; i < groups_.size(); ++i) {
    Optimizer& opt = *groups_[i].optimizer;
    if (groups_[i].params.empty()) continue;
    if (groups_[i].update_every > 1)
      step_accumulated(i, by_group[i], ctx);
    else
      opt.step(by_group[i], opt.folds_grad_scale() ? ctx : unscaled);
  }
  finish_ties(local, ctx);
}

namespace {

const ParamShard* find_shard(std::span<const ParamShard> local, const std::string& name) {
  for (const ParamShard& p : local)
    if (p.name == name) return &p;
  return nullptr;
}

}  // namespace

void OptimizerSet::begin_ties(std::span<const ParamShard> local,
                              std::vector<std::vector<ParamShard>>& by_group,
                              const StepContext& ctx) const {
  for (size_t i = 0; i < groups_.size(); ++i) {
    const Group& g = groups_[i];
    if (g.tied_to.empty() || (g.untie_step > 0 && ctx.step > g.untie_step)) continue;
    by_group[i].clear();  // its one parameter follows its target
    const ParamShard* tied = find_shard(local, g.params[0]);
    const ParamShard* target = find_shard(local, g.tied_to);
    if (tied == nullptr) continue;  // no rows here (nor of the target: same shape and placement)
    ENGINE_CHECK(target != nullptr && target->begin == tied->begin &&
                     target->grad.shape() == tied->grad.shape(),
                 "tied_to: '" + g.params[0] + "' and '" + g.tied_to +
                     "' must hold the same rows on every rank");
    // Both gradients carry the same scale (folded by both optimizers or by neither).
    backend_of(ctx).add(target->grad.data<float>(), target->grad.data<float>(),
                        tied->grad.data<float>(), tied->grad.numel());
  }
}

void OptimizerSet::finish_ties(std::span<const ParamShard> local, const StepContext& ctx) {
  for (Group& g : groups_) {
    if (g.tied_to.empty() || (g.untie_step > 0 && ctx.step > g.untie_step)) continue;
    const ParamShard* tied = find_shard(local, g.params[0]);
    const ParamShard* target = find_shard(local, g.tied_to);
    if (tied != nullptr)
      backend_of(ctx).copy(tied->value.data<float>(), target->value.data<float>(),
                           static_cast<size_t>(tied->value.numel()) * sizeof(float));
    if (ctx.step != g.untie_step) continue;
    // The untie step: the target's state becomes the tied parameter's, on top of its group's
    // other state (load_state copies what it is given).
    OptimizerState from, into;
    groups_[group_of(g.tied_to)].optimizer->save_state(from);
    g.optimizer->save_state(into);
    const std::string prefix = g.tied_to + "/";
    for (const auto& [key, t] : from.tensors)
      if (key.starts_with(prefix)) into.tensors[g.params[0] + "/" + key.substr(prefix.size())] = t;
    for (const auto& [key, n] : from.counters)
      if (key.starts_with(prefix)) into.counters[g.params[0] + "/" + key.substr(prefix.size())] = n;
    g.optimizer->load_state(into);
  }
}

void OptimizerSet::step_accumulated(size_t group, std::span<const ParamShard> shards,
                                    const StepContext& ctx) {
  Optimizer& opt = *groups_[group].optimizer;
  const int64_t every = groups_[group].update_every;
  const int64_t position = (ctx.step - 1) % every;  // 0: the window's first step
  core::Backend& backend = backend_of(ctx);
  std::vector<ParamShard> summed;
  for (const ParamShard& p : shards) {
    check_shard(p, opt.kind());
    // A folding optimizer's gradient arrives unscaled: scale it here (in place, this step's
    // buffer), since each step of the window has its own factor.
    if (opt.folds_grad_scale() && ctx.grad_scale != nullptr) {
      const std::span<float> g(p.grad.data<float>(), static_cast<size_t>(p.grad.numel()));
      backend.scale_many_by({&g, 1}, ctx.grad_scale);
    }
    auto it = accumulated_.find(p.name);
    if (position == 0) {
      if (it == accumulated_.end() || it->second.shape() != p.grad.shape())
        it = accumulated_
                 .insert_or_assign(p.name, core::Tensor::empty(p.grad.shape(), core::DType::F32,
                                                               backend.allocator()))
                 .first;
      backend.copy(it->second.data<float>(), p.grad.data<float>(),
                   static_cast<size_t>(p.grad.numel()) * sizeof(float));
    } else {
      if (it != accumulated_.end())  // host state read from a checkpoint, stepped on a device
        it->second = core::to_backend(backend, it->second);
      ENGINE_CHECK(it != accumulated_.end() && it->second.shape() == p.grad.shape(),
                   "optimizer group " + std::to_string(group) + " (update_every " +
                       std::to_string(every) + "): step " + std::to_string(ctx.step) +
                       " adds to the gradients accumulated since step " +
                       std::to_string(ctx.step - position) + ", but '" + p.name +
                       "' has none of its shape (a resume from a state without " +
                       kAccumulatedSlot + "?)");
      backend.add(it->second.data<float>(), it->second.data<float>(), p.grad.data<float>(),
                  p.grad.numel());
    }
    ParamShard s = p;
    s.grad = it->second;
    summed.push_back(s);
  }
  if (position != every - 1) return;
  StepContext scaled = ctx;
  scaled.grad_scale = nullptr;  // applied above, step by step
  opt.step(summed, scaled);
}

OptimizerState OptimizerSet::state() const {
  OptimizerState out;
  for (const Group& g : groups_)
    g.optimizer->save_state(out);
  for (const auto& [name, t] : accumulated_)
    out.tensors[name + "/" + kAccumulatedSlot] = t;
  return out;
}

void OptimizerSet::load_state(const OptimizerState& state) {
  std::vector<OptimizerState> by_group(groups_.size());
  auto param_of = [](const std::string& key) {
    const size_t slash = key.rfind('/');
    ENGINE_CHECK(slash != std::string::npos && slash > 0,
                 "optimizer state key '" + key + "' is not <param>/<slot>");
    return key.substr(0, slash);
  };
  const std::string accumulated = std::string("/") + kAccumulatedSlot;
  for (const auto& [key, t] : state.tensors) {
    if (key.ends_with(accumulated)) {
      const std::string param = param_of(key);
      ENGINE_CHECK(groups_[group_of(param)].update_every > 1,
                   "optimizer state '" + key + "' is update_every's, but the group of '" + param +
                       "' steps every step");
      accumulated_[param] = t.clone();
      continue;
    }
    by_group[group_of(param_of(key))].tensors[key] = t;
  }
  for (const auto& [key, n] : state.counters)
    by_group[group_of(param_of(key))].counters[key] = n;
  for (size_t i = 0; i < groups_.size(); ++i)
    groups_[i].optimizer->load_state(by_group[i]);
}

}  // namespace optim
