#include "apps/optim_replay/osft_case.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "core/check.h"
#include "core/compare.h"
#include "core/safetensors.h"
#include "optim/osft/osft.h"
#include "optim/osft/osft_factors.h"
#include "optim/registry.h"

namespace replay {

namespace {

// Tolerances of the golden README: factors, parameters and state after AdamW; projecting a
// gradient stored in the file.
constexpr double kTrajectoryAtol = 1e-4;
constexpr double kProjectionAtol = 1e-5;
constexpr const char* kTrained[] = {"U_low", "S_low", "V_low"};

struct Target {
  std::string name;
  int64_t rows = 0, cols = 0, k_high = 0;
  optim::OsftFactors full;   // frozen factors stay as decomposed; trained ones are refreshed
  optim::OsftFactors local;  // this rank's rows of every factor
};

// The rows of each factor: U_* split along N, S_* and V_* along their rank index.
int64_t factor_rows(const Target& t, const std::string& factor) {
  if (factor.starts_with("U")) return t.rows;
  const int64_t r = std::min(t.rows, t.cols) - t.k_high;
  return factor.ends_with("high") ? t.k_high : r;
}

core::Tensor local_rows(const core::Tensor& full, int64_t rows, comm::Communicator& comm) {
  const comm::Range r = optim::osft_rows(rows, comm.size(), comm.rank());
  core::Shape shape = full.shape();
  shape[0] = r.size();
  core::Tensor out = core::Tensor::empty(shape);
  if (r.size() > 0) out.copy_from(full.slice(0, r.begin, r.size()));
  return out;
}

core::Tensor gather_rows(const core::Tensor& local, const core::Shape& full_shape,
                         comm::Communicator& comm) {
  core::Tensor full = core::Tensor::empty(full_shape);
  const int64_t width = full_shape[0] == 0 ? 0 : core::shape_numel(full_shape) / full_shape[0];
  std::vector<int64_t> counts;
  for (int p = 0; p < comm.size(); ++p)
    counts.push_back(optim::osft_rows(full_shape[0], comm.size(), p).size() * width);
  if (comm.size() == 1) {
    full.copy_from(local);
    return full;
  }
  float dummy = 0;
  comm.all_gather(local.numel() ? local.data<float>() : &dummy, full.data<float>(), counts);
  return full;
}

// NaN-proof (core::compare): a non-finite value makes the difference +infinity.
double max_abs_diff(const core::Tensor& a, const core::Tensor& b, const std::string& key) {
  ENGINE_CHECK(a.numel() == b.numel(), "osft replay: '" + key + "' has " + b.str() +
                                           " in the file but we computed " + a.str());
  return core::compare(a.data<float>(), b.data<float>(), a.numel()).max_abs();
}

class OsftReplay {
 public:
  OsftReplay(const std::string& path, comm::Communicator& comm,
             const std::vector<std::string>& sets)
      : file_(path), comm_(comm) {
    const YAML::Node hyper = YAML::Load(file_.metadata_value("hyperparameters"));
    steps_ = std::stoll(file_.metadata_value("steps"));
    YAML::Node group(YAML::NodeType::Map);
    group["params"].push_back("*");
    group["optimizer"] = "osft";
    for (const char* key : {"unfreeze_rank_ratio", "lr", "betas", "eps", "weight_decay"})
      group[key] = hyper[key];
    group["project_params"] = hyper["post_step_param_projection"];
    if (hyper["grad_clip_max_norm"] && !hyper["grad_clip_max_norm"].IsNull())
      clip_ = hyper["grad_clip_max_norm"].as<double>();
    for (const std::string& s : sets) {
      const size_t eq = s.find('=');
      ENGINE_CHECK(eq != std::string::npos && eq > 0, "--set expects key=value, got '" + s + "'");
      group[s.substr(0, eq)] = YAML::Load(s.substr(eq + 1));
    }
    group = YAML::Load(YAML::Dump(group));
    optim::HyperReader reader(group, path + " (osft)");
    reader.skip("params");
    reader.skip("optimizer");
    owned_ = optim::Registry::global().create("osft", reader);
    osft_ = dynamic_cast<optim::Osft*>(owned_.get());
    osft_->set_communicator(&comm_, nullptr, core::cpu_backend());

    // Targets as the file lists them; k_high by our rule must equal the file's.
    std::vector<optim::OsftTargetWeight> weights;
    for (const YAML::Node& p : YAML::Load(file_.metadata_value("params"))) {
      Target t;
      t.name = p["name"].as<std::string>();
      t.rows = p["shape"][0].as<int64_t>();
      t.cols = p["shape"][1].as<int64_t>();
      t.k_high = osft_->config().k_high_for(t.name, t.rows, t.cols);
      ENGINE_CHECK(t.k_high == p["k_high"].as<int64_t>(),
                   path + ": k_high of '" + t.name + "' is " + std::to_string(t.k_high) +
                       " by our rule, " + p["k_high"].as<std::string>() + " in the file");
      weights.push_back({t.name, file_.read_f32("init/" + t.name), t.k_high});
      targets_.push_back(std::move(t));
    }
    const std::vector<optim::OsftFactors> full =
        optim::osft_decompose_all(weights, &comm_, core::cpu_backend());
    for (size_t i = 0; i < targets_.size(); ++i) {
      Target& t = targets_[i];
      t.full = full[i];
      for (const char* f : optim::kOsftFactorNames) {
        const std::string key = "init/" + t.name + "." + f;
        check(0, key, optim::factor_by_name(t.full, f), file_.read_f32(key), kTrajectoryAtol);
        optim::factor_by_name(t.local, f) =
            local_rows(optim::factor_by_name(t.full, f), factor_rows(t, f), comm_);
      }
      osft_->add_target(t.name, t.rows, t.cols, t.k_high, t.local.U_high, t.local.V_high);
      const std::string shard_key =
          shard_prefix() + "rank" + std::to_string(comm_.rank()) + "/" + t.name + ".V_high";
      if (file_.contains(shard_key))
        check(0, shard_key, t.local.V_high, file_.read_f32(shard_key), kTrajectoryAtol);
    }
  }

  std::vector<OsftCheck> run() {
    for (int64_t t = 1; t <= steps_; ++t)
      step(t);
    return checks_;
  }

 private:
  std::string shard_prefix() const { return "shard/ws" + std::to_string(comm_.size()) + "/"; }

  void check(int64_t step, const std::string& key, const core::Tensor& ours,
             const core::Tensor& ref, double atol) {
    checks_.push_back({step, key, max_abs_diff(ours, ref, key), atol});
  }

  // Compares the gathered U_low / S_low / V_low of `p` (values or grads) with `prefix`. Every
  // rank gathers every trained factor of every target, in one order, whether it holds rows of
  // it or not (`p` may leave out its empty parts): a rank that skipped a gather would pair its
  // next collectives with different calls on the other ranks and read what they sent for those.
  void check_parts(int64_t step, const std::string& prefix, std::span<const optim::ParamShard> p,
                   bool grads, double atol, bool u_v_only = false) {
    for (const Target& t : targets_)
      for (const char* f : kTrained) {
        const std::string name = t.name + "." + f;
        const std::string key = prefix + name;
        if ((u_v_only && name.ends_with(".S_low")) || !file_.contains(key)) continue;
        core::Shape full = optim::factor_by_name(t.local, f).shape();
        full[0] = factor_rows(t, f);
        const auto part = std::ranges::find(p, name, &optim::ParamShard::name);
        core::Shape empty = full;
        empty[0] = 0;
        const core::Tensor local = part == p.end() ? core::Tensor::empty(empty)
                                   : grads         ? part->grad
                                                   : part->value;
        ENGINE_CHECK(local.size(0) == optim::osft_rows(full[0], comm_.size(), comm_.rank()).size(),
                     "osft replay: rank " + std::to_string(comm_.rank()) + " holds " + local.str() +
                         " of '" + name + "'");
        check(step, key, gather_rows(local, full, comm_), file_.read_f32(key), atol);
      }
  }

  // This rank's parts of every trained factor (empty ones included) with the given gradients.
  std::vector<optim::ParamShard> parts(const std::map<std::string, core::Tensor>& grads) {
    std::vector<optim::ParamShard> out;
    for (Target& t : targets_)
      for (const char* f : kTrained) {
        const std::string name = t.name + "." + f;
        const core::Tensor& value = optim::factor_by_name(t.local, f);
        core::Shape full = value.shape();
        full[0] = factor_rows(t, f);
        const comm::Range rows = optim::osft_rows(full[0], comm_.size(), comm_.rank());
        out.push_back({name, full, rows.begin, value, grads.at(name)});
      }
    return out;
  }

  // A trainer passes only the parts a rank holds rows of; the optimizer still joins every
  // collective.
  static std::vector<optim::ParamShard> non_empty(std::span<const optim::ParamShard> p) {
    std::vector<optim::ParamShard> out;
    for (const optim::ParamShard& s : p)
      if (s.value.numel() > 0) out.push_back(s);
    return out;
  }

  void step(int64_t t) {
    const std::string ts = std::to_string(t) + "/";
    // Chain rule at the current full factors, then global-norm clipping of the raw gradients.
    std::map<std::string, core::Tensor> full_grads;
    double norm2 = 0;
    for (Target& x : targets_) {
      for (const char* f : kTrained)
        optim::factor_by_name(x.full, f) = gather_rows(
            optim::factor_by_name(x.local, f), optim::factor_by_name(x.full, f).shape(), comm_);
      const optim::OsftLowGrads g =
          optim::osft_factor_grads(x.full, file_.read_f32("grad/" + ts + x.name + ".dW"));
      full_grads[x.name + ".U_low"] = g.U_low;
      full_grads[x.name + ".S_low"] = g.S_low;
      full_grads[x.name + ".V_low"] = g.V_low;
    }
    for (auto& [name, g] : full_grads) {
      check(t, "grad/" + ts + name, g, file_.read_f32("grad/" + ts + name), kTrajectoryAtol);
      for (float v : g.to_vector())
        norm2 += static_cast<double>(v) * v;
    }
    const double norm = std::sqrt(norm2);
    if (clip_ > 0 && norm > clip_) {
      const auto scale = static_cast<float>(clip_ / (norm + 1e-6));  // torch clip_grad_norm_
      for (auto& [name, g] : full_grads) {
        float* d = g.data<float>();
        for (int64_t i = 0; i < g.numel(); ++i)
          d[i] *= scale;
        check(t, "grad_clipped/" + ts + name, g, file_.read_f32("grad_clipped/" + ts + name),
              kTrajectoryAtol);
      }
    }

    // The projection of the file's own (clipped) gradient, against the unsharded and the
    // sharded reference results.
    std::map<std::string, core::Tensor> stored, ours;
    const std::string source = clip_ > 0 ? "grad_clipped/" : "grad/";
    for (Target& x : targets_)
      for (const char* f : kTrained) {
        const std::string name = x.name + "." + f;
        stored[name] = local_rows(file_.read_f32(source + ts + name), factor_rows(x, f), comm_);
        ours[name] = local_rows(full_grads[name], factor_rows(x, f), comm_);
      }
    const std::vector<optim::ParamShard> of_file =
        osft_->project_gradients(non_empty(parts(stored)));
    check_parts(t, "projected/" + ts, of_file, true, kProjectionAtol);
    check_parts(t, shard_prefix() + "projected/" + ts, of_file, true, kProjectionAtol, true);
    const std::string rank_coeff =
        shard_prefix() + "rank" + std::to_string(comm_.rank()) + "/u_coeff_batched/" + ts;
    if (file_.contains(rank_coeff.substr(0, rank_coeff.size() - 1))) {
      check(t, rank_coeff, coefficients(osft_->projector().last_partial_coefficients()),
            file_.read_f32(rank_coeff.substr(0, rank_coeff.size() - 1)), kProjectionAtol);
      const std::string total = shard_prefix() + "u_coeff_batched/" + std::to_string(t);
      check(t, total, coefficients(osft_->projector().last_coefficients()), file_.read_f32(total),
            kProjectionAtol);
    }

    // Our step: project, AdamW, project the parameters.
    const std::vector<optim::ParamShard> projected =
        osft_->project_gradients(non_empty(parts(ours)));
    check_parts(t, "projected/" + ts, projected, true, kTrajectoryAtol);
    optim::StepContext ctx;
    ctx.backend = &core::cpu_backend();
    ctx.step = t;
    ctx.total_steps = steps_;
    osft_->adamw_step(projected, ctx);
    const std::vector<optim::ParamShard> all = parts(ours);
    check_parts(t, "adamw/" + ts, all, false, kTrajectoryAtol);
    if (osft_->config().project_params) osft_->project_parameters(projected);
    check_parts(t, "param/" + ts, all, false, kTrajectoryAtol);

    optim::OptimizerState state;
    osft_->save_state(state);
    for (const optim::ParamShard& s : all)
      for (const char* slot : {"exp_avg", "exp_avg_sq"}) {
        const auto it = state.tensors.find(s.name + "/" + slot);
        core::Tensor local =
            it != state.tensors.end() ? it->second : core::Tensor::empty(s.value.shape());
        const std::string key = "state/" + ts + s.name + "." + slot;
        check(t, key, gather_rows(local, s.full_shape, comm_), file_.read_f32(key),
              kTrajectoryAtol);
      }
    for (Target& x : targets_) {
      for (const char* f : kTrained)
        optim::factor_by_name(x.full, f) = gather_rows(
            optim::factor_by_name(x.local, f), optim::factor_by_name(x.full, f).shape(), comm_);
      check(t, "param/" + ts + x.name, optim::osft_reconstruct(x.full),
            file_.read_f32("param/" + ts + x.name), kTrajectoryAtol);
    }
  }

  static core::Tensor coefficients(const std::vector<double>& c) {
    core::Tensor out = core::Tensor::empty({static_cast<int64_t>(c.size())});
    for (size_t i = 0; i < c.size(); ++i)
      out.data<float>()[i] = static_cast<float>(c[i]);
    return out;
  }

  core::SafetensorsReader file_;
  comm::Communicator& comm_;
  int64_t steps_ = 0;
  double clip_ = 0;
  std::unique_ptr<optim::Optimizer> owned_;
  optim::Osft* osft_ = nullptr;
  std::vector<Target> targets_;
  std::vector<OsftCheck> checks_;
};

}  // namespace

bool is_osft_golden(const std::string& path) {
  const core::SafetensorsReader f(path);
  const auto it = f.metadata().find("optimizer");
  return it != f.metadata().end() && it->second == "osft";
}

std::vector<OsftCheck> replay_osft(const std::string& path, comm::Communicator& comm,
                                   const std::vector<std::string>& sets) {
  return OsftReplay(path, comm, sets).run();
}

int osft_main(const std::string& path, const std::vector<std::string>& sets, bool json, bool quiet,
              comm::Communicator& comm) {
  const std::vector<OsftCheck> checks = replay_osft(path, comm, sets);
  // The worst check relative to its own tolerance decides (an infinite one, from a non-finite
  // value, first).
  const OsftCheck* worst = &checks.front();
  for (const OsftCheck& c : checks)
    if (!(c.max_abs / c.atol <= worst->max_abs / worst->atol)) worst = &c;
  const bool pass = worst->max_abs <= worst->atol;
  if (comm.rank() != 0) return pass ? 0 : 1;
  if (json) {
    for (const OsftCheck& c : checks) {
      char max_abs[32] = "null";  // JSON has no infinity
      if (std::isfinite(c.max_abs)) std::snprintf(max_abs, sizeof max_abs, "%.6e", c.max_abs);
      std::printf(
          "{\"file\":\"%s\",\"np\":%d,\"step\":%lld,\"key\":\"%s\",\"max_abs\":%s,"
          "\"atol\":%.1e}\n",
          path.c_str(), comm.size(), static_cast<long long>(c.step), c.key.c_str(), max_abs,
          c.atol);
    }
  } else if (!quiet) {
    std::printf("%-5s %-60s %-12s %-8s\n", "step", "key", "max_abs", "atol");
    for (const OsftCheck& c : checks)
      std::printf("%-5lld %-60s %-12.3e %-8.0e%s\n", static_cast<long long>(c.step), c.key.c_str(),
                  c.max_abs, c.atol, c.max_abs > c.atol ? "  ABOVE atol" : "");
  }
  std::printf("%s: osft np=%d %zu checks, worst max_abs %.3e (%s) vs atol %.0e: %s\n", path.c_str(),
              comm.size(), checks.size(), worst->max_abs, worst->key.c_str(), worst->atol,
              pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

}  // namespace replay
