#include "engine/reparam/osft_reparam.h"

#include "comm/placement.h"
#include "core/check.h"
#include "core/transfer.h"
#include "engine/checkpoint/sharded_state.h"

namespace engine {

namespace {

constexpr const char* kFrozenPrefix = "osft/";

}  // namespace

std::vector<OsftReparam::Target> OsftReparam::find_targets(const model::Gpt& gpt,
                                                           optim::OptimizerSet& groups) {
  std::vector<Target> targets;
  const model::ParamTable& table = gpt.table();
  for (size_t i = 0; i < table.size(); ++i) {
    const model::ParamInfo& p = table[i];
    auto* osft = dynamic_cast<optim::Osft*>(&groups.optimizer(groups.group_of(p.name)));
    if (osft == nullptr || p.shape.size() != 2) continue;
    const int64_t k = osft->config().k_high_for(p.name, p.shape[0], p.shape[1]);
    if (k == 0) continue;  // trains dense in its group
    targets.push_back({p.name, i, p.layer, p.shape[0], p.shape[1], k, osft});
  }
  return targets;
}

std::unique_ptr<Reparam> OsftReparam::create(const ReparamSetup& setup) {
  if (find_targets(setup.gpt, setup.optimizers).empty()) return nullptr;
  const std::string source = setup.config.source.empty() ? "config" : setup.config.source;
  ENGINE_CHECK(setup.config.zero.stage <= 2,
               "config error: " + source + ": key 'zero.stage' = 3 is not supported with " +
                   "osft targets (their factors rest whole on every rank); use 1 or 2");
  return std::make_unique<OsftReparam>(setup.gpt, setup.optimizers, &setup.tensors, &setup.tensors,
                                       &comm::shard_range);
}

OsftReparam::OsftReparam(model::Gpt& gpt, optim::OptimizerSet& groups, comm::Communicator* comm,
                         comm::Communicator* shard_group, optim::RowSplit split)
    : gpt_(gpt),
      backend_(gpt.backend()),
      comm_(comm),
      ops_(optim::make_osft_ops(backend_)),
      targets_(find_targets(gpt, groups)) {
  std::vector<optim::OsftTargetWeight> weights;
  for (size_t t = 0; t < targets_.size(); ++t) {
    const Target& target = targets_[t];
    bool first_of_group = true;
    for (size_t u = 0; u < t; ++u)
      first_of_group &= targets_[u].optimizer != target.optimizer;
    if (first_of_group) target.optimizer->set_communicator(shard_group, split, backend_);
    const core::Tensor w = gpt.param(target.param);
    ENGINE_CHECK(w.defined() && w.device() == backend_.device(),
                 "osft: the model's weight '" + target.name +
                     "' is not resident in the memory of " + backend_.name());
    weights.push_back({target.name, core::to_host(backend_, w), target.k_high});
  }
  const std::vector<optim::OsftFactors> full = optim::osft_decompose_all(weights, comm, backend_);
  for (size_t t = 0; t < targets_.size(); ++t) {
    Target& target = targets_[t];
    optim::OsftFactors f = full[t];
    for (const char* name : optim::kOsftFactorNames) {
      Factor factor;
      factor.name = target.name + "." + name;
      factor.target = t;
      factor.layer = target.layer;
      factor.value = optim::factor_by_name(f, name);
      factor.trained = std::string(name).ends_with("_low");
      if (factor.trained) {
        factor.grad =
            core::Tensor::empty(factor.value.shape(), core::DType::F32, backend_.allocator());
        backend_.fill_zero(factor.grad.raw_data(), factor.grad.nbytes());
        groups.add_alias(factor.name, target.name);
      }
      factors_.push_back(std::move(factor));
    }
    // The frozen rows this rank holds, views of the full factors.
    const int world = shard_group ? shard_group->size() : 1;
    const int rank = shard_group ? shard_group->rank() : 0;
    auto rows = [&](const core::Tensor& x) {
      const comm::Range r = split(x.size(0), world, rank);
      return x.slice(0, r.begin, r.size());
    };
    target.optimizer->add_target(target.name, target.rows, target.cols, target.k_high,
                                 rows(f.U_high), rows(f.V_high));
  }
  write_all();
}

void OsftReparam::redecompose(comm::Communicator* comm) {
  std::vector<optim::OsftTargetWeight> weights;
  for (const Target& t : targets_)
    weights.push_back({t.name, core::to_host(backend_, gpt_.param(t.param)), t.k_high});
  const std::vector<optim::OsftFactors> full = optim::osft_decompose_all(weights, comm, backend_);
  for (size_t i = 0; i < targets_.size(); ++i)
    for (size_t j = 0; j < 6; ++j) {  // in place: the optimizers hold views of the frozen rows
      core::Tensor& value = factors_[6 * i + j].value;
      if (value.numel() > 0)
        backend_.copy(value.raw_data(),
                      optim::factor_by_name(full[i], optim::kOsftFactorNames[j]).raw_data(),
                      value.nbytes());
    }
  zero_grads();
  write_all();
}

bool OsftReparam::owns(const std::string& name) const {
  for (const Factor& f : factors_)
    if (f.name == name) return true;
  return false;
}

bool OsftReparam::is_target(const std::string& param) const {
  for (const Target& t : targets_)
    if (t.name == param) return true;
  return false;
}

optim::OsftFactors OsftReparam::full(size_t i) const {
  optim::OsftFactors f;
  for (size_t j = 0; j < 6; ++j)
    optim::factor_by_name(f, optim::kOsftFactorNames[j]) = factors_.at(6 * i + j).value;
  return f;
}

void OsftReparam::write_all() {
  for (size_t i = 0; i < targets_.size(); ++i)
    optim::osft_reconstruct_into(*ops_, full(i), gpt_.param(targets_[i].param), 0);
}

std::vector<Trainable> OsftReparam::replace_trainables(std::vector<Trainable> model_trainables) {
  std::vector<Trainable> out;
  for (Trainable& t : model_trainables)
    if (!is_target(t.name)) out.push_back(std::move(t));
  for (Factor& f : factors_) {
    if (!f.trained) continue;
    Trainable t;
    t.name = f.name;
    t.shape = f.value.shape();
    t.layer = f.layer;
    t.value = f.value;
    t.grad = f.grad;
    out.push_back(std::move(t));
  }
  return out;
}

void OsftReparam::map_grads(int layer) {
  for (size_t i = 0; i < targets_.size(); ++i)
    if (targets_[i].layer == layer) map_target_grads(i);
}

void OsftReparam::map_target_grads(size_t i) {
  // The dense gradient dL/dW the model accumulated, into the trained factors' gradients.
  const core::Tensor dense = gpt_.grad(targets_[i].param);
  const optim::OsftLowGrads grads{factors_[6 * i + 3].grad, factors_[6 * i + 4].grad,
                                  factors_[6 * i + 5].grad};
  optim::osft_add_factor_grads(*ops_, full(i), dense, grads);
  backend_.fill_zero(dense.raw_data(), dense.nbytes());
}

void OsftReparam::save_frozen(std::vector<SavedSlice>& slices, int rank) const {
  if (rank != 0) return;
  for (const Factor& f : factors_)
    if (!f.trained) slices.push_back({kFrozenPrefix + f.name, f.value.shape(), 0, 0, f.value});
}

void OsftReparam::load_frozen(const CheckpointReader& reader) {
  for (Factor& f : factors_) {
    if (f.trained) continue;
    const std::string key = kFrozenPrefix + f.name;
    ENGINE_CHECK(reader.has(key), "checkpoint " + reader.dir() + " has no OSFT factor " + f.name +
                                      " (was it trained without this osft group?)");
    ENGINE_CHECK(reader.global_shape(key) == f.value.shape(),
                 "checkpoint " + reader.dir() + ": OSFT factor " + f.name + " has shape " +
                     core::shape_str(reader.global_shape(key)) + ", this run expects " +
                     core::shape_str(f.value.shape()));
    // In place: the optimizers hold views of it.
    core::write_from_host(backend_, f.value, reader.read_full(key));
  }
}

void OsftReparam::zero_grads() {
  for (Factor& f : factors_)
    if (f.trained) backend_.fill_zero(f.grad.raw_data(), f.grad.nbytes());
}

void OsftReparam::init_from(const std::map<std::string, core::Tensor>& weights) {
  for (const Target& t : targets_) {
    core::write_from_host(backend_, gpt_.param(t.param), weights.at(t.name));
  }
  redecompose(comm_);
}

void OsftReparam::load(const CheckpointReader& reader) {
  load_frozen(reader);
  write_all();
}

void OsftReparam::save(std::vector<SavedSlice>& slices, int rank) const {
  save_frozen(slices, rank);
}

void OsftReparam::on_layer_event(model::Gpt::LayerEvent event, int layer) {
  if (event == model::Gpt::LayerEvent::kAfterBackward) map_grads(layer);
}

void OsftReparam::after_step() {
  write_all();
}

core::Tensor OsftReparam::dense_from_checkpoint(const CheckpointReader& reader,
                                                const std::string& param, const core::Shape& shape,
                                                core::Backend& backend) {
  if (shape.size() != 2 || !reader.has(kFrozenPrefix + param + ".U_high")) return {};
  // The trained factors are trainables ("param/..."), the frozen ones OSFT's own ("osft/...").
  optim::OsftFactors f;
  for (const char* name : optim::kOsftFactorNames) {
    const std::string factor = param + "." + name;
    const std::string key =
        std::string(name).ends_with("_low") ? param_key(factor) : kFrozenPrefix + factor;
    ENGINE_CHECK(reader.has(key), "checkpoint " + reader.dir() + " holds OSFT factors of " + param +
                                      " but not " + key);
    optim::factor_by_name(f, name) = core::to_backend(backend, reader.read_full(key));
  }
  const int64_t n = shape[0], m = shape[1], k = f.S_high.numel(), r = f.S_low.numel();
  const std::vector<std::pair<const core::Tensor*, core::Shape>> expected = {
      {&f.U_high, {n, k}}, {&f.S_high, {k}}, {&f.V_high, {k, m}},
      {&f.U_low, {n, r}},  {&f.S_low, {r}},  {&f.V_low, {r, m}}};
  for (const auto& [t, want] : expected)
    ENGINE_CHECK(t->shape() == want && k + r == std::min(n, m),
                 "checkpoint " + reader.dir() + ": the OSFT factors of " + param + " (" +
                     core::shape_str(shape) + ") have shapes " + f.U_high.str() + ", " +
                     f.S_high.str() + ", " + f.V_high.str() + ", " + f.U_low.str() + ", " +
                     f.S_low.str() + ", " + f.V_low.str() + ", which do not make it");
  core::Tensor w = core::Tensor::empty(shape, core::DType::F32, backend.allocator());
  optim::osft_reconstruct_into(*optim::make_osft_ops(backend), f, w, 0);
  return core::to_host(backend, w);
}

}  // namespace engine
