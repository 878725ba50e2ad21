#include "optim/muon/muon.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/check.h"
#include "optim/glob.h"
#include "optim/muon/muon_ops.h"
#include "optim/muon/newton_schulz.h"

namespace optim {

MuonConfig MuonConfig::normuon_defaults() {
  MuonConfig c;
  c.normalize = true;
  c.orthogonalizer = "polar_express";
  c.cautious_wd = true;
  return c;
}

MuonConfig MuonConfig::from_yaml(HyperReader& r, const MuonConfig& defaults) {
  MuonConfig c = defaults;
  c.lr = r.number("lr", c.lr);
  c.momentum = r.number("momentum", c.momentum);
  c.nesterov = r.boolean("nesterov", c.nesterov);
  c.ns_steps = static_cast<int>(r.integer("ns_steps", c.ns_steps));
  c.orthogonalizer = r.string("orthogonalizer", c.orthogonalizer);
  c.ns_tf32 = r.boolean("ns_tf32", c.ns_tf32);
  c.ns_bf16 = r.boolean("ns_bf16", c.ns_bf16);
  const std::string rounding = r.string("ns_bf16_rounding", c.ns_bf16_eager ? "eager" : "compiled");
  if (rounding != "compiled" && rounding != "eager")
    r.fail("ns_bf16_rounding", "must be compiled or eager, got '" + rounding + "'");
  c.ns_bf16_eager = rounding == "eager";
  c.weight_decay = r.number("weight_decay", c.weight_decay);
  c.lr_mul = r.number("lr_mul", c.lr_mul);
  c.wd_mul = r.number("wd_mul", c.wd_mul);
  c.momentum_start = r.number("momentum_start", c.momentum);
  c.momentum_warmup_steps = r.integer("momentum_warmup_steps", 0);
  c.momentum_end = r.number("momentum_end", c.momentum_start);
  c.momentum_cooldown_steps = r.integer("momentum_cooldown_steps", 0);
  c.normalize = r.boolean("normalize", c.normalize);
  c.beta2 = r.number("beta2", c.beta2);
  c.cautious_wd = cautious_weight_decay(r, c.cautious_wd);
  if (!(c.beta2 >= 0 && c.beta2 < 1)) r.fail("beta2", "must be in [0, 1)");
  if (c.lr < 0) r.fail("lr", "must be >= 0");
  // A negative decay grows the weights; a negative multiplier turns the step around.
  if (!(c.weight_decay >= 0)) r.fail("weight_decay", "must be >= 0");
  if (!(c.lr_mul >= 0)) r.fail("lr_mul", "must be >= 0");
  if (!(c.wd_mul >= 0)) r.fail("wd_mul", "must be >= 0");
  auto check_momentum = [&](const char* key, double mu) {
    if (!(mu >= 0 && mu < 1)) r.fail(key, "must be in [0, 1)");
  };
  check_momentum("momentum", c.momentum);
  check_momentum("momentum_start", c.momentum_start);
  check_momentum("momentum_end", c.momentum_end);
  if (c.ns_steps < 1) r.fail("ns_steps", "must be >= 1");
  if (c.momentum_warmup_steps < 0) r.fail("momentum_warmup_steps", "must be >= 0");
  if (c.momentum_cooldown_steps < 0) r.fail("momentum_cooldown_steps", "must be >= 0");
  if (c.orthogonalizer != "ns5" && c.orthogonalizer != "polar_express")
    r.fail("orthogonalizer", "must be ns5 or polar_express");
  if (r.has("matrix_views")) {
    YAML::Node views = r.node("matrix_views");
    if (!views.IsMap())
      r.fail("matrix_views", "must be a map {glob: k | [k, r, c] | [[k, r, c], ...]}");
    c.matrix_views.clear();
    for (const auto& kv : views) {
      MatrixViewRule rule;
      rule.glob = kv.first.as<std::string>();
      const YAML::Node& v = kv.second;
      const std::string where =
          "matrix_views entry '" + rule.glob + "' (line " + std::to_string(v.Mark().line + 1) + ")";
      const std::string expected = " must be a positive integer, [k, r, c] or [[k, r, c], ...]";
      // One [k, r, c] of positive integers.
      auto read_piece = [&](const YAML::Node& triple) {
        int64_t x[3] = {0, 0, 0};
        if (!triple.IsSequence() || triple.size() != 3)
          ENGINE_FAIL(r.context() + ": " + where + expected);
        for (size_t i = 0; i < 3; ++i)
          if (!triple[i].IsScalar() || !YAML::convert<int64_t>::decode(triple[i], x[i]) || x[i] < 1)
            ENGINE_FAIL(r.context() + ": " + where + expected);
        return MatrixView{x[0], x[1], x[2]};
      };
      if (v.IsScalar()) {
        if (!YAML::convert<int64_t>::decode(v, rule.blocks) || rule.blocks < 1)
          ENGINE_FAIL(r.context() + ": " + where + expected);
      } else if (v.IsSequence() && v.size() > 0 && v[0].IsSequence()) {
        for (const YAML::Node& triple : v)
          rule.pieces.push_back(read_piece(triple));
      } else {
        rule.pieces.push_back(read_piece(v));
      }
      c.matrix_views.push_back(std::move(rule));
    }
  }
  return c;
}

double MuonConfig::momentum_at(int64_t step, int64_t total_steps) const {
  const double t = static_cast<double>(step - 1);  // steps already taken
  double mu = momentum;
  if (momentum_warmup_steps > 0) {
    const double frac = std::min(t / static_cast<double>(momentum_warmup_steps), 1.0);
    mu = (1.0 - frac) * momentum_start + frac * momentum;
  }
  if (momentum_cooldown_steps > 0 && total_steps > 0) {
    const double start = static_cast<double>(total_steps - momentum_cooldown_steps);
    if (t > start) {
      const double frac = std::min((t - start) / static_cast<double>(momentum_cooldown_steps), 1.0);
      mu = (1.0 - frac) * mu + frac * momentum_end;
    }
  }
  return mu;
}

Muon::Muon(const MuonConfig& config, const char* kind)
    : config_(config),
      kind_(kind),
      schedule_(schedule_by_name(config.orthogonalizer, config.ns_steps, kind)),
      slots_(kind, {"momentum_buffer", "second_moment"}, {}) {
  schedule_.tf32 = config.ns_tf32;
  schedule_.bf16 = config.ns_bf16;
  schedule_.bf16_eager = config.ns_bf16_eager;
}

std::vector<MatrixView> Muon::view_of(const std::string& name, const core::Shape& shape) const {
  ENGINE_CHECK(shape.size() >= 2, std::string(kind_) + ": parameter '" + name + "' of shape " +
                                      core::shape_str(shape) +
                                      " is not a matrix; give it to an elementwise optimizer");
  const int64_t numel = core::shape_numel(shape);
  for (const MatrixViewRule& rule : config_.matrix_views) {
    if (!glob_match(rule.glob, name)) continue;
    if (rule.pieces.empty()) {
      ENGINE_CHECK(shape[0] % rule.blocks == 0, std::string(kind_) + ": matrix_views splits '" +
                                                    name + "' " + core::shape_str(shape) +
                                                    " into " + std::to_string(rule.blocks) +
                                                    " row blocks but its rows do not divide");
      return {{rule.blocks, shape[0] / rule.blocks, shape[0] == 0 ? 0 : numel / shape[0]}};
    }
    int64_t covered = 0;
    std::string pieces;
    for (const MatrixView& v : rule.pieces) {
      covered += v.count * v.rows * v.cols;
      pieces += (pieces.empty() ? "[" : ", [") + std::to_string(v.count) + ", " +
                std::to_string(v.rows) + ", " + std::to_string(v.cols) + "]";
    }
    ENGINE_CHECK(covered == numel, std::string(kind_) + ": matrix view " + pieces +
                                       " does not fit '" + name + "' " + core::shape_str(shape) +
                                       " (" + std::to_string(covered) + " elements against " +
                                       std::to_string(numel) + ")");
    return rule.pieces;
  }
  MatrixView v;
  v.rows = shape[shape.size() - 2];
  v.cols = shape.back();
  v.count = v.rows * v.cols == 0 ? 0 : numel / (v.rows * v.cols);
  return {v};
}

void Muon::check_param(const std::string& name, const core::Shape& shape) const {
  view_of(name, shape);
}

void Muon::step(std::span<const ParamShard> params, const StepContext& ctx) {
  core::Backend& backend = backend_of(ctx);
  const std::unique_ptr<MuonOps> ops = make_muon_ops(backend);
  const double lr = config_.lr * ctx.lr_scale;
  const double wd = lr * config_.weight_decay * config_.wd_mul;
  const float decay = static_cast<float>(config_.cautious_wd ? 1.0 : 1.0 - wd);
  const double mu_d = config_.momentum_at(ctx.step, ctx.total_steps);
  const float mu = static_cast<float>(mu_d);
  const float one_minus_mu = static_cast<float>(1.0 - mu_d);
  // Each parameter's update lives until the one update call for all of them; the
  // orthogonalisations run together between the momentum and the update, one job and one pending
  // update per run of matrices of its view.
  struct Pending {
    float* w;
    float* second_moment;  // NorMuon's, else nullptr
    MatrixView view;
  };
  std::vector<core::Tensor> updates;
  std::vector<Pending> pending;
  std::vector<NewtonSchulzJob> jobs;
  for (const ParamShard& p : params) {
    check_shard(p, kind_);
    ENGINE_CHECK(p.begin == 0 && p.value.shape() == p.full_shape,
                 std::string(kind_) + ": '" + p.name +
                     "' must be stepped whole (Owned placement), got rows from " +
                     std::to_string(p.begin) + " of " + p.value.str());
    const std::vector<MatrixView> views = view_of(p.name, p.full_shape);
    const int64_t n = p.value.numel();
    if (n == 0) continue;
    float* w = p.value.data<float>();
    const float* g = p.grad.data<float>();
    float* b = slots_.tensor(p.name, "momentum_buffer", p.value.shape(), backend).data<float>();
    backend.scale(w, decay, n);
    backend.axpby(b, one_minus_mu, g, mu, n);  // B = (1 - mu) G + mu B
    core::Tensor update =
        core::Tensor::empty(p.value.shape(), core::DType::F32, backend.allocator());
    float* u = update.data<float>();
    if (config_.nesterov) {
      backend.copy(u, g, static_cast<size_t>(n) * sizeof(float));
      backend.axpby(u, mu, b, one_minus_mu, n);  // U = mu B + (1 - mu) G
    } else {
      backend.copy(u, b, static_cast<size_t>(n) * sizeof(float));
    }
    // NorMuon's second moments: per run, count x max(rows, cols), the runs one after the other.
    float* second_moment = nullptr;
    if (config_.normalize) {
      int64_t moments = 0;
      for (const MatrixView& v : views)
        moments += v.count * std::max(v.rows, v.cols);
      second_moment = slots_.tensor(p.name, "second_moment", {moments}, backend).data<float>();
    }
    int64_t at = 0, moment_at = 0;
    for (const MatrixView& v : views) {
      jobs.push_back({u + at, v.count, v.rows, v.cols});
      pending.push_back({w + at, second_moment ? second_moment + moment_at : nullptr, v});
      at += v.count * v.rows * v.cols;
      moment_at += v.count * std::max(v.rows, v.cols);
    }
    updates.push_back(std::move(update));
  }
  ops->newton_schulz_many(jobs, schedule_);
  std::vector<MuonUpdate> steps;
  for (size_t i = 0; i < pending.size(); ++i) {
    const MatrixView& view = pending[i].view;
    float* w = pending[i].w;
    float* u = jobs[i].x;
    const int64_t n = view.count * view.rows * view.cols;
    const double shape_scale =
        std::sqrt(std::max(1.0, static_cast<double>(view.rows) / static_cast<double>(view.cols)));
    const double lr_eff = lr * config_.lr_mul * shape_scale;
    if (!config_.normalize && !config_.cautious_wd) {
      backend.axpby(w, static_cast<float>(-lr_eff), u, 1.0f, n);
      continue;
    }
    steps.push_back({w, u, pending[i].second_moment, view.count, view.rows, view.cols, lr_eff,
                     config_.cautious_wd ? wd : 0.0});
  }
  ops->update(steps, config_.beta2);
}

void Muon::save_state(OptimizerState& out) const {
  slots_.save(out);
}

void Muon::load_state(const OptimizerState& in) {
  slots_.load(in);
}

}  // namespace optim
