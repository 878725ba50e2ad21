#include "engine/osft_reparam.h"

#include "engine/core/check.h"

namespace engine {

OsftReparam::OsftReparam(model::Gpt& gpt, optim::OptimizerSet& groups, comm::Communicator* comm,
                         optim::RowSplit split)
    : gpt_(gpt) {
  const model::ParamTable& table = gpt.table();
  std::vector<optim::OsftTargetWeight> weights;
  for (size_t i = 0; i < table.size(); ++i) {
    const model::ParamInfo& p = table[i];
    auto* osft = dynamic_cast<optim::Osft*>(&groups.optimizer(groups.group_of(p.name)));
    if (osft == nullptr || p.shape.size() != 2) continue;
    const int64_t k = osft->config().k_high_for(p.name, p.shape[0], p.shape[1]);
    if (k == 0) continue;  // trains dense in its group
    ENGINE_CHECK(gpt.param(i).defined() && gpt.param(i).device().is_cpu(),
                 "osft: the model's weight '" + p.name + "' is not resident in host memory");
    targets_.push_back({p.name, i, p.layer, p.shape[0], p.shape[1], k, osft});
    weights.push_back({p.name, gpt.param(i).clone(), k});
  }
  const std::vector<optim::OsftFactors> full = optim::osft_decompose_all(weights, comm);
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
        factor.grad = core::Tensor::zeros(factor.value.shape());
        groups.add_alias(factor.name, target.name);
      }
      factors_.push_back(std::move(factor));
    }
    // The frozen rows this rank holds, views of the full factors.
    const int world = comm ? comm->size() : 1, rank = comm ? comm->rank() : 0;
    auto rows = [&](const core::Tensor& x) {
      const comm::Range r = split(x.size(0), world, rank);
      return x.slice(0, r.begin, r.size());
    };
    target.optimizer->add_target(target.name, target.rows, target.cols, target.k_high,
                                 rows(f.U_high), rows(f.V_high));
  }
  write_all();
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
      gpt_.param(targets_[i].param).copy_from(optim::osft_reconstruct(full(i)));
}

void OsftReparam::write_all() {
  for (size_t i = 0; i < targets_.size(); ++i)
    gpt_.param(targets_[i].param).copy_from(optim::osft_reconstruct(full(i)));
}

void OsftReparam::map_grads(int layer) {
  for (size_t i = 0; i < targets_.size(); ++i) {
    if (targets_[i].layer != layer) continue;
    const optim::OsftLowGrads g = optim::osft_factor_grads(full(i), gpt_.grad(targets_[i].param));
    const core::Tensor* parts[] = {&g.U_low, &g.S_low, &g.V_low};
    for (size_t j = 0; j < 3; ++j) {
      float* dst = factors_[6 * i + 3 + j].grad.data<float>();
      const float* src = parts[j]->data<float>();
      for (int64_t e = 0; e < parts[j]->numel(); ++e)
        dst[e] += src[e];
    }
  }
}

void OsftReparam::zero_grads() {
  for (Factor& f : factors_)
    if (f.trained) f.grad.fill(0.0f);
}

}  // namespace engine
