#include "optim/osft/osft.h"

#include <map>

#include "core/check.h"
#include "optim/glob.h"
#include "optim/osft/osft_factors.h"

namespace optim {

OsftConfig OsftConfig::from_yaml(HyperReader& r) {
  OsftConfig c;
  if (!r.has("unfreeze_rank_ratio"))
    r.fail("", "missing 'unfreeze_rank_ratio' (the fraction of singular directions that train)");
  if (!r.has("lr")) r.fail("", "missing 'lr'");
  c.unfreeze_rank_ratio = r.number("unfreeze_rank_ratio", 0.0);
  if (!(c.unfreeze_rank_ratio >= 0.0 && c.unfreeze_rank_ratio <= 1.0))
    r.fail("unfreeze_rank_ratio", "must be in [0, 1]");
  c.adamw.lr = r.number("lr", 0.0);
  const std::vector<double> betas = r.numbers("betas", {0.9, 0.95});
  if (betas.size() != 2) r.fail("betas", "must be a list of two numbers [beta1, beta2]");
  c.adamw.beta1 = betas[0];
  c.adamw.beta2 = betas[1];
  c.adamw.eps = r.number("eps", 1e-8);
  c.adamw.weight_decay = r.number("weight_decay", 0.0);
  c.adamw.torch_eps = true;  // torch.optim.AdamW, as the reference
  if (c.adamw.lr < 0) r.fail("lr", "must be >= 0");
  if (!(c.adamw.beta1 >= 0 && c.adamw.beta1 < 1)) r.fail("betas", "beta1 must be in [0, 1)");
  if (!(c.adamw.beta2 >= 0 && c.adamw.beta2 < 1)) r.fail("betas", "beta2 must be in [0, 1)");
  if (!(c.adamw.eps > 0))
    r.fail("eps", "must be > 0 (it keeps the update finite where the second moment is 0)");
  if (!(c.adamw.weight_decay >= 0)) r.fail("weight_decay", "must be >= 0");  // else growth
  c.project_params = r.boolean("project_params", true);
  c.v_high_cache_mb = r.number("v_high_cache_mb", c.v_high_cache_mb);
  if (!(c.v_high_cache_mb >= 0)) r.fail("v_high_cache_mb", "must be >= 0");
  if (r.has("k_high")) {
    const YAML::Node map = r.node("k_high");
    if (!map.IsMap()) r.fail("k_high", "must be a map {glob: k_high}");
    for (const auto& kv : map) {
      int64_t k = -1;
      if (!kv.second.IsScalar() || !YAML::convert<int64_t>::decode(kv.second, k) || k < 0)
        ENGINE_FAIL(r.context() + ": k_high entry '" + kv.first.as<std::string>() + "' (line " +
                    std::to_string(kv.second.Mark().line + 1) + ") must be a non-negative integer");
      c.k_high.emplace_back(kv.first.as<std::string>(), k);
    }
  }
  return c;
}

int64_t OsftConfig::k_high_for(const std::string& name, int64_t rows, int64_t cols) const {
  const int64_t rank = std::min(rows, cols);
  for (const auto& [glob, k] : k_high) {
    if (!glob_match(glob, name)) continue;
    ENGINE_CHECK(k < rank, "osft: k_high " + std::to_string(k) + " (glob '" + glob + "') for '" +
                               name + "' [" + std::to_string(rows) + ", " + std::to_string(cols) +
                               "] must be below " + std::to_string(rank) +
                               " so that a direction trains");
    return k;
  }
  return osft_k_high(rows, cols, unfreeze_rank_ratio);
}

Osft::Osft(const OsftConfig& config) : config_(config), adamw_(config.adamw) {}

void Osft::check_param(const std::string& name, const core::Shape& shape) const {
  adamw_.check_param(name, shape);
}

void Osft::check_not_dense_target(const ParamShard& p) const {
  if (p.full_shape.size() != 2) return;
  for (const char* factor : kOsftFactorNames)
    if (p.name.ends_with(std::string(".") + factor)) return;
  // A matrix the policy targets must reach this optimizer as its factors: stepping it dense
  // would silently be plain AdamW.
  const int64_t k = config_.k_high_for(p.name, p.full_shape[0], p.full_shape[1]);
  ENGINE_CHECK(k == 0, "osft: '" + p.name + "' " + core::shape_str(p.full_shape) +
                           " is an OSFT target (k_high " + std::to_string(k) +
                           ") but reached the optimizer as a dense matrix; its factors must be "
                           "held beside the model (or set k_high: {'" +
                           p.name + "': 0} to train it dense)");
}

void Osft::set_communicator(comm::Communicator* comm, RowSplit split, core::Backend& backend) {
  ENGINE_CHECK(targets_.empty(), "osft: set_communicator after targets were added");
  comm_ = comm;
  split_ = split;
  backend_ = &backend;
  projector_.reset();
}

void Osft::add_target(const std::string& name, int64_t rows, int64_t cols, int64_t k_high,
                      core::Tensor U_high_rows, core::Tensor V_high_rows) {
  ENGINE_CHECK(backend_ != nullptr,
               "osft: target '" + name + "' added before set_communicator named its backend");
  if (!projector_) {
    const auto budget = static_cast<int64_t>(config_.v_high_cache_mb * 1024.0 * 1024.0);
    projector_ = std::make_unique<OsftProjector>(comm_, budget, split_, *backend_);
  }
  ENGINE_CHECK(targets_.insert(name).second, "osft: target '" + name + "' added twice");
  projector_->add_target(name, rows, cols, k_high, std::move(U_high_rows), std::move(V_high_rows));
  target_order_.push_back(name);
  shapes_.push_back({rows, cols, k_high});
}

void Osft::project(std::span<const ParamShard> params, bool grads) {
  if (!projector_) return;
  std::map<std::string, const ParamShard*> by_name;
  for (const ParamShard& p : params)
    by_name[p.name] = &p;
  const int world = projector_->world_size(), rank = projector_->rank();
  const size_t n = target_order_.size();
  std::vector<float*> u(n, nullptr), v(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    const auto [rows, cols, k] = shapes_[i];
    const int64_t r = std::min(rows, cols) - k;
    auto part = [&](const char* factor, int64_t full_rows, int64_t width) -> float* {
      const std::string key = target_order_[i] + "." + factor;
      const auto it = by_name.find(key);
      if (it == by_name.end()) return nullptr;
      const ParamShard& p = *it->second;
      const comm::Range want = projector_->rows(full_rows);
      ENGINE_CHECK(p.begin == want.begin && p.value.numel() == want.size() * width,
                   "osft: '" + key + "' on rank " + std::to_string(rank) + " holds " +
                       p.value.str() + " from row " + std::to_string(p.begin) +
                       ", expected rows [" + std::to_string(want.begin) + ", " +
                       std::to_string(want.end) + ") of " + std::to_string(full_rows) + " over " +
                       std::to_string(world) + " ranks");
      if (want.size() == 0) return nullptr;
      return grads ? p.grad.data<float>() : p.value.data<float>();
    };
    u[i] = part("U_low", rows, r);
    v[i] = part("V_low", r, cols);
  }
  projector_->project(u, v);
}

std::vector<ParamShard> Osft::project_gradients(std::span<const ParamShard> params) {
  std::vector<ParamShard> out(params.begin(), params.end());
  for (ParamShard& p : out) {
    check_shard(p, "osft");
    check_not_dense_target(p);
    if (projector_ && (p.name.ends_with(".U_low") || p.name.ends_with(".V_low"))) {
      // A copy in the factors' memory, projected in place.
      core::Tensor copy =
          core::Tensor::empty(p.grad.shape(), core::DType::F32, backend_->allocator());
      if (copy.numel() > 0) backend_->copy(copy.raw_data(), p.grad.raw_data(), copy.nbytes());
      p.grad = std::move(copy);
    }
  }
  project(out, true);
  return out;
}

void Osft::adamw_step(std::span<const ParamShard> params, const StepContext& ctx) {
  adamw_.step(params, ctx);
}

void Osft::project_parameters(std::span<const ParamShard> params) {
  project(params, false);
}

void Osft::step(std::span<const ParamShard> params, const StepContext& ctx) {
  const core::Backend& backend = backend_of(ctx);
  ENGINE_CHECK(!projector_ || backend.device() == backend_->device(),
               std::string("osft: step ") + std::to_string(ctx.step) + " runs on " +
                   backend.name() + " but the factors' projections were set up on " +
                   backend_->name());
  const std::vector<ParamShard> projected = project_gradients(params);
  adamw_step(projected, ctx);
  if (config_.project_params) project_parameters(projected);
}

void Osft::save_state(OptimizerState& out) const {
  adamw_.save_state(out);
}

void Osft::load_state(const OptimizerState& in) {
  adamw_.load_state(in);
}

}  // namespace optim
