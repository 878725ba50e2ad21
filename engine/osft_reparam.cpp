#include "engine/osft_reparam.h"

#include "core/check.h"

namespace engine {

namespace {

constexpr const char* kFrozenPrefix = "osft/";

// A host copy of a tensor in `backend`'s memory (the weights the one-time SVDs read).
core::Tensor to_host(core::Backend& backend, const core::Tensor& t) {
  core::Tensor host = core::Tensor::empty(t.shape());
  if (t.numel() > 0) backend.copy_to_host(host.raw_data(), t.raw_data(), t.nbytes());
  return host;
}

}  // namespace

std::unique_ptr<OsftReparam> OsftReparam::create_if_targeted(model::Gpt& gpt,
                                                             optim::OptimizerSet& groups,
                                                             comm::Communicator* comm,
                                                             comm::Communicator* shard_group,
                                                             optim::RowSplit split) {
  bool any = false;
  for (size_t g = 0; g < groups.num_groups(); ++g)
    any |= dynamic_cast<optim::Osft*>(&groups.optimizer(g)) != nullptr;
  if (!any) return nullptr;
  auto reparam = std::make_unique<OsftReparam>(gpt, groups, comm, shard_group, split);
  if (reparam->targets().empty()) return nullptr;
  return reparam;
}

OsftReparam::OsftReparam(model::Gpt& gpt, optim::OptimizerSet& groups, comm::Communicator* comm,
                         comm::Communicator* shard_group, optim::RowSplit split)
    : gpt_(gpt), backend_(gpt.backend()), ops_(optim::make_osft_ops(backend_)) {
  const model::ParamTable& table = gpt.table();
  std::vector<optim::OsftTargetWeight> weights;
  for (size_t i = 0; i < table.size(); ++i) {
    const model::ParamInfo& p = table[i];
    auto* osft = dynamic_cast<optim::Osft*>(&groups.optimizer(groups.group_of(p.name)));
    if (osft == nullptr || p.shape.size() != 2) continue;
    const int64_t k = osft->config().k_high_for(p.name, p.shape[0], p.shape[1]);
    if (k == 0) continue;  // trains dense in its group
    bool first_of_group = true;
    for (const Target& t : targets_)
      first_of_group &= t.optimizer != osft;
    if (first_of_group) osft->set_communicator(shard_group, split, backend_);
    ENGINE_CHECK(gpt.param(i).defined() && gpt.param(i).device() == backend_.device(),
                 "osft: the model's weight '" + p.name + "' is not resident in the memory of " +
                     backend_.name());
    targets_.push_back({p.name, i, p.layer, p.shape[0], p.shape[1], k, osft});
    weights.push_back({p.name, to_host(backend_, gpt.param(i)), k});
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
    weights.push_back({t.name, to_host(backend_, gpt_.param(t.param)), t.k_high});
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

bool OsftReparam::is_factor(const std::string& name) const {
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

void OsftReparam::write_dense(int layer) {
  for (size_t i = 0; i < targets_.size(); ++i)
    if (targets_[i].layer == layer)
      optim::osft_reconstruct_into(*ops_, full(i), gpt_.param(targets_[i].param), 0);
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
    const core::Tensor host = reader.read_full(key);
    if (host.numel() > 0)
      backend_.copy_from_host(f.value.raw_data(), host.raw_data(), host.nbytes());
  }
}

void OsftReparam::zero_grads() {
  for (Factor& f : factors_)
    if (f.trained) backend_.fill_zero(f.grad.raw_data(), f.grad.nbytes());
}

std::map<std::string, core::Tensor> dense_checkpoint_weights(const std::string& dir,
                                                             const model::ParamTable& table) {
  const CheckpointReader reader(dir);
  std::map<std::string, core::Tensor> out;
  for (const model::ParamInfo& p : table.params()) {
    const std::string key = "param/" + p.name;
    ENGINE_CHECK(reader.has(key), "train.init_from: checkpoint " + dir + " has no parameter " +
                                      p.name + " (an OSFT-trained checkpoint holds factors: " +
                                      "`engine export` writes its dense weights)");
    ENGINE_CHECK(reader.global_shape(key) == p.shape,
                 "train.init_from: checkpoint " + dir + ": parameter " + p.name + " has shape " +
                     core::shape_str(reader.global_shape(key)) + ", the model expects " +
                     core::shape_str(p.shape));
    out[p.name] = reader.read_full(key);
  }
  return out;
}

}  // namespace engine
