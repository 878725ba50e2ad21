#include "apps/optim_replay/golden_case.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "comm/shard_ops.h"
#include "core/check.h"
#include "core/compare.h"
#include "optim/muon/muon_ops.h"
#include "optim/muon/newton_schulz.h"

namespace replay {

namespace {

// The reference's hyperparameter names and ours. Keys not listed here are handled below:
// param_overrides (one group per overridden parameter, ahead of the optional catch-all group),
// ns_coefficients / ns_eps (must equal our NS5 constants), pe_coefficients / pe_eps / pe_safety
// (must equal our Polar Express constants), *_rule (documentation only).
struct HyperName {
  const char* reference;
  const char* ours;
};
constexpr HyperName kHyperparameterMap[] = {
    {"lr", "lr"},
    {"momentum", "momentum"},
    {"nesterov", "nesterov"},
    {"ns_steps", "ns_steps"},
    {"betas", "betas"},
    {"eps", "eps"},
    {"weight_decay", "weight_decay"},
    {"lr_mul", "lr_mul"},
    {"wd_mul", "wd_mul"},
    {"matrix_views", "matrix_views"},
    {"update_every", "update_every"},
    {"tied_to", "tied_to"},
    {"untie_step", "untie_step"},
    {"beta2", "beta2"},
    // SOAP family (docs/specs/soap_family.md): the reference's names are ours.
    {"shampoo_beta", "shampoo_beta"},
    {"weight_decay_method", "weight_decay_method"},
    {"correct_bias", "correct_bias"},
    {"correct_shampoo_beta_bias", "correct_shampoo_beta_bias"},
    {"fp32_matmul_prec", "fp32_matmul_prec"},
    {"qr_fp32_matmul_prec", "qr_fp32_matmul_prec"},
    {"use_eigh", "use_eigh"},
    {"power_iter_steps", "power_iter_steps"},
    {"max_update_rms", "max_update_rms"},
    {"use_kl_shampoo", "use_kl_shampoo"},
    {"precondition_frequency", "precondition_frequency"},
    {"adam_warmup_steps", "adam_warmup_steps"},
    {"use_adaptive_criteria", "use_adaptive_criteria"},
    {"adaptive_update_tolerance", "adaptive_update_tolerance"},
    {"max_precond_dim", "max_precond_dim"},
    {"precondition_1d", "precondition_1d"},
};

// Reference optimizer name -> registry name (+ a setting the reference implies), or ->
// orthogonaliser for one-shot files.
struct OptimizerName {
  const char* reference;
  const char* ours;
  const char* implied;  // "key: value" added to every group, or ""
};
constexpr OptimizerName kOptimizerMap[] = {
    {"adamw", "adamw", ""},
    {"muon", "muon", ""},
    {"normuon", "normuon", ""},
    {"adam_cwd", "adamw", "weight_decay_mode: cautious"},
    {"soap", "soap", ""},
    {"rekls", "rekls", ""},
    {"stacked_soap", "stacked_soap", ""},
    {"tp_rekls", "tp_rekls", ""},
};

// Versions of the SOAP reference that differ from current main in more than their knobs (spec
// sections 5 and 6), recognised by the shape of their hyperparameters, and the settings that
// make ours follow them.
//   amortized (pre-#160, has precondition_frequency): QR path pre-sorts the basis and permutes V.
//   ReferenceSoap (REF, {defaults, param_groups}): no shampoo-beta bias correction, eps on the
//   uncorrected sqrt(V) with the bias correction on the step size. Its 1-D parameters without
//   precondition_1d are plain Adam of that form, which is our adamw (eps_mode spec).
constexpr const char* kAmortizedSoapImplied = "{qr_sort: before}";
constexpr const char* kReferenceSoapImplied = "{correct_shampoo_beta_bias: false, adam_eps: raw}";
constexpr HyperName kOrthogonalizerMap[] = {{"newton_schulz5", "ns5"},
                                            {"polar_express", "polar_express"}};

const char* our_name(const std::string& reference) {
  for (const HyperName& h : kHyperparameterMap)
    if (reference == h.reference) return h.ours;
  return nullptr;
}

bool approx_equal(double a, double b) {
  return std::abs(a - b) <= 1e-6 * std::max(1.0, std::abs(b));
}

void check_same_triples(const std::string& path, const YAML::Node& given,
                        const optim::NewtonSchulzSchedule& ours) {
  std::vector<std::array<double, 3>> triples;
  if (given.IsSequence() && given.size() == 3 && given[0].IsScalar()) {
    triples.assign(ours.coefficients.size(),
                   {given[0].as<double>(), given[1].as<double>(), given[2].as<double>()});
  } else {
    for (const YAML::Node& t : given)
      triples.push_back({t[0].as<double>(), t[1].as<double>(), t[2].as<double>()});
  }
  ENGINE_CHECK(triples.size() == ours.coefficients.size(),
               path + ": the file's orthogonaliser has " + std::to_string(triples.size()) +
                   " iterations, ours " + std::to_string(ours.coefficients.size()));
  for (size_t i = 0; i < triples.size(); ++i)
    for (int j = 0; j < 3; ++j)
      ENGINE_CHECK(approx_equal(ours.coefficients[i][j], triples[i][j]),
                   path + ": orthogonaliser coefficient " + std::to_string(i) + "." +
                       std::to_string(j) + " differs from ours");
}

double metadata_number(const core::SafetensorsReader& f, const std::string& key) {
  const std::string& v = f.metadata_value(key);
  try {
    return std::stod(v);
  } catch (const std::exception&) {
    ENGINE_FAIL(f.path() + ": metadata '" + key + "' is not a number: " + v);
  }
}

// Applies the --set overrides to every group and re-parses the groups from text, so that errors
// can point at lines of the generated groups.
GoldenCase& finish_groups(GoldenCase& g, const std::vector<std::string>& sets) {
  for (const std::string& s : sets) {
    const size_t eq = s.find('=');
    ENGINE_CHECK(eq != std::string::npos && eq > 0, "--set expects key=value, got '" + s + "'");
    YAML::Node value = YAML::Load(s.substr(eq + 1));
    for (YAML::Node group : g.groups)
      group[s.substr(0, eq)] = value;
  }
  g.groups = YAML::Load(YAML::Dump(g.groups));
  return g;
}

// ReferenceSoap's {defaults, param_groups}: one soap group per reference group, except a group
// of 1-D parameters without precondition_1d, which is plain Adam (adamw).
YAML::Node reference_soap_groups(const GoldenCase& g, const YAML::Node& hyper) {
  YAML::Node groups(YAML::NodeType::Sequence);
  for (const YAML::Node& ref : hyper["param_groups"]) {
    YAML::Node merged = YAML::Clone(hyper["defaults"]);
    for (const auto& kv : ref)
      merged[kv.first.as<std::string>()] = YAML::Clone(kv.second);
    bool all_1d = true;
    for (const YAML::Node& name : ref["params"])
      for (const comm::ParamDesc& p : g.params)
        if (p.name == name.as<std::string>() && p.shape.size() != 1) all_1d = false;
    const bool plain_adam = all_1d && !merged["precondition_1d"].as<bool>();
    YAML::Node group(YAML::NodeType::Map);
    group["params"] = YAML::Clone(ref["params"]);
    group["optimizer"] = plain_adam ? "adamw" : "soap";
    for (const auto& kv : merged) {
      const std::string key = kv.first.as<std::string>();
      if (key == "params") continue;
      if (key == "data_format") {
        ENGINE_CHECK(kv.second.as<std::string>() == "channels_first",
                     g.path + ": only data_format channels_first is supported");
        continue;
      }
      if (key == "merge_dims") {
        ENGINE_CHECK(!kv.second.as<bool>(), g.path + ": merge_dims is not supported");
        continue;
      }
      if (plain_adam) {
        if (key == "lr" || key == "betas" || key == "eps" || key == "weight_decay")
          group[key] = YAML::Clone(kv.second);
        continue;
      }
      const char* ours = our_name(key);
      ENGINE_CHECK(ours, g.path + ": no mapping for reference hyperparameter '" + key + "'");
      group[ours] = YAML::Clone(kv.second);
    }
    if (!plain_adam)
      for (const auto& kv : YAML::Load(kReferenceSoapImplied))
        group[kv.first.as<std::string>()] = kv.second;
    groups.push_back(group);
  }
  return groups;
}

}  // namespace

GoldenCase load_golden(const std::string& path, const std::string& optimizer,
                       const std::vector<std::string>& sets) {
  GoldenCase g;
  g.path = path;
  g.file = std::make_shared<core::SafetensorsReader>(path);
  const core::SafetensorsReader& f = *g.file;
  g.reference_optimizer = f.metadata_value("optimizer");
  g.steps = static_cast<int64_t>(metadata_number(f, "steps"));
  g.suggested_atol = metadata_number(f, "suggested_atol");
  for (const core::StTensorInfo& t : f.tensors())
    if (t.name.starts_with("init/")) g.params.push_back({t.name.substr(5), t.shape});
  ENGINE_CHECK(!g.params.empty(), path + ": no init/* tensors");
  for (const comm::ParamDesc& p : g.params)
    for (int64_t t = 1; t <= g.steps; ++t)
      ENGINE_CHECK(f.contains("param/" + std::to_string(t) + "/" + p.name),
                   path + ": missing param/" + std::to_string(t) + "/" + p.name);

  YAML::Node hyper;
  try {
    hyper = YAML::Load(f.metadata_value("hyperparameters"));
  } catch (const YAML::Exception& e) {
    ENGINE_FAIL(path + ": metadata 'hyperparameters' does not parse: " + e.what());
  }
  ENGINE_CHECK(hyper.IsMap(), path + ": metadata 'hyperparameters' is not a map");

  for (const HyperName& o : kOrthogonalizerMap) {
    if (g.reference_optimizer != o.reference) continue;
    ENGINE_CHECK(optimizer.empty() && sets.empty(),
                 path + ": --optimizer and --set do not apply to an orthogonaliser file");
    g.orthogonalizer = o.ours;
    const optim::NewtonSchulzSchedule ours =
        optim::schedule_by_name(o.ours, hyper["steps"] ? hyper["steps"].as<int>() : 5, path);
    check_same_triples(path, hyper["coefficients"], ours);
    const double scale = 1.0 + (hyper["safety"] ? hyper["safety"].as<double>() : 0.0);
    ENGINE_CHECK(approx_equal(ours.norm_scale, scale) &&
                     approx_equal(ours.norm_eps, hyper["eps"].as<double>()),
                 path + ": normalisation differs from ours");
    return g;
  }

  std::string registry_name = optimizer;
  std::string implied;
  if (registry_name.empty()) {
    for (const OptimizerName& o : kOptimizerMap)
      if (g.reference_optimizer == o.reference) {
        registry_name = o.ours;
        implied = o.implied;
      }
    ENGINE_CHECK(!registry_name.empty(), path + ": no mapping for reference optimizer '" +
                                             g.reference_optimizer + "' (pass --optimizer NAME)");
  }

  if (registry_name == "soap" && hyper["defaults"] && hyper["param_groups"]) {
    g.groups = reference_soap_groups(g, hyper);
    return finish_groups(g, sets);
  }
  if (registry_name == "soap" && hyper["precondition_frequency"]) implied = kAmortizedSoapImplied;

  YAML::Node base(YAML::NodeType::Map);
  YAML::Node overrides;
  YAML::Node partition_dims;
  for (const auto& kv : hyper) {
    const std::string key = kv.first.as<std::string>();
    if (key.ends_with("_rule")) continue;
    // The registry name implies these (rekls, stacked_soap); null means the reference default.
    if (key == "_implied_soap_settings" || kv.second.IsNull()) continue;
    if (key == "partition_dim") {
      partition_dims = kv.second;
      continue;
    }
    if (key == "param_overrides") {
      overrides = kv.second;
    } else if (key == "ns_coefficients") {
      check_same_triples(path, kv.second, optim::ns5_schedule(hyper["ns_steps"].as<int>()));
    } else if (key == "ns_eps") {
      ENGINE_CHECK(approx_equal(optim::ns5_schedule().norm_eps, kv.second.as<double>()),
                   path + ": ns_eps differs from ours");
    } else if (key == "pe_coefficients") {
      check_same_triples(path, kv.second, optim::polar_express_schedule());
    } else if (key == "pe_eps") {
      ENGINE_CHECK(approx_equal(optim::polar_express_schedule().norm_eps, kv.second.as<double>()),
                   path + ": pe_eps differs from ours");
    } else if (key == "pe_safety") {
      ENGINE_CHECK(
          approx_equal(optim::polar_express_schedule().norm_scale, 1.0 + kv.second.as<double>()),
          path + ": pe_safety differs from ours");
    } else if (const char* ours = our_name(key)) {
      base[ours] = kv.second;
    } else {
      ENGINE_FAIL(path + ": no mapping for reference hyperparameter '" + key + "'");
    }
  }
  if (!implied.empty()) {
    const YAML::Node kv = YAML::Load(implied);
    for (const auto& e : kv)
      base[e.first.as<std::string>()] = e.second;
  }
  // The file's matrix views are the whole truth for it: no default views.
  if ((registry_name == "muon" || registry_name == "normuon") && !base["matrix_views"])
    base["matrix_views"] = YAML::Node(YAML::NodeType::Map);

  g.groups = YAML::Node(YAML::NodeType::Sequence);
  auto make_group = [&](const std::string& glob) {
    YAML::Node group(YAML::NodeType::Map);
    group["params"].push_back(glob);
    group["optimizer"] = registry_name;
    for (const auto& kv : base)
      group[kv.first.as<std::string>()] = YAML::Clone(kv.second);
    return group;
  };
  if (overrides) {
    for (const auto& kv : overrides) {
      YAML::Node group = make_group(kv.first.as<std::string>());
      for (const auto& o : kv.second) {
        const char* ours = our_name(o.first.as<std::string>());
        ENGINE_CHECK(ours, path + ": no mapping for override '" + o.first.as<std::string>() + "'");
        group[ours] = o.second;
      }
      g.groups.push_back(group);
    }
  }
  if (partition_dims.IsMap()) {
    // tp_rekls: one group per parameter with its partition_dim (null: replicated).
    for (const auto& kv : partition_dims) {
      YAML::Node group = make_group(kv.first.as<std::string>());
      if (registry_name == "tp_rekls")
        group["partition_dim"] = kv.second.IsNull() ? std::string("none") : kv.second.Scalar();
      g.groups.push_back(group);
    }
  } else {
    // Optional: where the overrides name every parameter of the file, it is left with none.
    YAML::Node rest = make_group("*");
    rest["optional"] = true;
    g.groups.push_back(rest);
  }
  return finish_groups(g, sets);
}

void truncate_steps(GoldenCase& golden, int64_t steps) {
  if (steps <= 0 || steps >= golden.steps) return;
  golden.steps = steps;
  const auto& meta = golden.file->metadata();
  const auto per_step = meta.find("max_abs_diff_f32_vs_f64_per_step");
  if (per_step == meta.end()) return;
  const YAML::Node diffs = YAML::Load(per_step->second);
  double worst = 0;
  for (int64_t t = 0; t < steps && t < static_cast<int64_t>(diffs.size()); ++t)
    worst = std::max(worst, diffs[t].as<double>());
  golden.suggested_atol = std::max(1e-6, 10 * worst);
}

// ---- replay -----------------------------------------------------------------------------------

Replayer::Replayer(const GoldenCase& golden, comm::Communicator& comm)
    : golden_(golden), comm_(comm) {
  std::vector<comm::ParamDesc> infos;
  if (golden.orthogonalizer.empty()) {
    set_ = std::make_unique<optim::OptimizerSet>(golden.groups, golden.params);
    for (const comm::ParamDesc& p : golden.params)
      infos.push_back({p.name, p.shape, set_->placement(p.name), 0});
  } else {
    for (const comm::ParamDesc& p : golden.params)
      infos.push_back({p.name, p.shape, comm::Placement::owned(), 0});
  }
  plan_ = std::make_unique<comm::ShardingPlan>(infos, comm.size(), comm.rank(), 2);
  for (size_t i = 0; i < golden.params.size(); ++i) {
    full_.push_back(golden.file->read_f32("init/" + golden.params[i].name));
    local_.push_back(core::Tensor::empty(plan_->local_shape(i)));
    comm::copy_local_part(comm_, *plan_, i, full_[i], local_[i]);
    // tp_rekls files also hold each rank's shard at their world size: a parameter we shard
    // (or replicate) the same way must have the same local part.
    const std::string shard =
        "shard/" + std::to_string(comm.rank()) + "/init/" + golden.params[i].name;
    const auto& meta = golden.file->metadata();
    const auto ws = meta.find("world_size");
    if (ws != meta.end() && ws->second == std::to_string(comm.size()) &&
        !plan_->placement(i).is_owned() && golden.file->contains(shard)) {
      const core::Tensor theirs = golden.file->read_f32(shard);
      ENGINE_CHECK(theirs.shape() == local_[i].shape() &&
                       std::memcmp(theirs.raw_data(), local_[i].raw_data(), theirs.nbytes()) == 0,
                   golden.path + ": rank " + std::to_string(comm.rank()) + "'s part of '" +
                       golden.params[i].name + "' " + local_[i].str() + " is not the file's " +
                       shard + " " + theirs.str());
    }
  }
}

const core::Tensor& Replayer::full(const std::string& name) const {
  return full_.at(plan_->index(name));
}

void Replayer::set_full(const std::string& name, const core::Tensor& value) {
  const size_t i = plan_->index(name);
  full_[i].copy_from(value);
  comm::copy_local_part(comm_, *plan_, i, full_[i], local_[i]);
}

std::vector<Difference> Replayer::step(int64_t t) {
  const size_t n = golden_.params.size();
  if (golden_.orthogonalizer.empty()) {
    std::vector<core::Tensor> grads(n);
    std::vector<optim::ParamShard> parts;
    for (size_t i = 0; i < n; ++i) {
      if (local_[i].numel() == 0) continue;  // nothing of this parameter on this rank
      const std::string& name = golden_.params[i].name;
      // The already-averaged gradient: this rank's part of it, at the requested placement.
      core::Tensor full_grad = golden_.file->read_f32("grad/" + std::to_string(t) + "/" + name);
      grads[i] = core::Tensor::empty(plan_->local_shape(i));
      comm::copy_local_part(comm_, *plan_, i, full_grad, grads[i]);
      parts.push_back({name, golden_.params[i].shape, plan_->range(i, comm_.rank()).begin,
                       local_[i], grads[i]});
    }
    optim::StepContext ctx;
    ctx.backend = &core::cpu_backend();
    ctx.step = t;
    ctx.total_steps = golden_.steps;
    ctx.comm = &comm_;
    set_->step(parts, ctx);
  } else {
    const optim::NewtonSchulzSchedule schedule =
        optim::schedule_by_name(golden_.orthogonalizer, 5, golden_.path);
    const std::unique_ptr<optim::MuonOps> ops = optim::make_muon_ops(core::cpu_backend());
    for (size_t i = 0; i < n; ++i) {
      if (local_[i].numel() == 0) continue;
      const core::Shape& s = golden_.params[i].shape;
      const int64_t rows = s[s.size() - 2], cols = s.back();
      ops->newton_schulz(local_[i].data<float>(), rows, cols, schedule,
                         local_[i].numel() / (rows * cols));
    }
  }
  std::vector<Difference> out;
  for (size_t i = 0; i < n; ++i) {
    comm::all_gather_param(comm_, *plan_, i, local_[i], full_[i]);
    const std::string& name = golden_.params[i].name;
    const core::Tensor ref = golden_.file->read_f32("param/" + std::to_string(t) + "/" + name);
    // NaN-proof: a non-finite parameter makes both measures +infinity.
    const core::Difference d =
        core::compare(full_[i].data<float>(), ref.data<float>(), ref.numel());
    out.push_back({t, name, d.max_abs(), d.max_rel()});
  }
  return out;
}

std::vector<Difference> Replayer::run() {
  std::vector<Difference> all;
  for (int64_t t = 1; t <= golden_.steps; ++t) {
    std::vector<Difference> d = step(t);
    all.insert(all.end(), d.begin(), d.end());
  }
  return all;
}

Difference worst_difference(const std::vector<Difference>& diffs) {
  Difference worst = diffs.empty() ? Difference{} : diffs.front();
  for (const Difference& d : diffs)
    if (d.max_abs > worst.max_abs) worst = d;
  return worst;
}

bool passes(const Difference& worst, double atol) {
  return core::within(worst.max_abs, atol);
}

// ---- state files ------------------------------------------------------------------------------

void save_state(const optim::OptimizerState& state, const std::string& path) {
  core::SafetensorsWriter w;
  for (const auto& [key, t] : state.tensors)
    w.add(key, t);
  for (const auto& [key, n] : state.counters)
    w.set_metadata("counter:" + key, std::to_string(n));
  w.write(path);
}

optim::OptimizerState load_state(const std::string& path) {
  const core::SafetensorsContents c = core::load_safetensors(path);
  optim::OptimizerState state;
  state.tensors = c.tensors;
  for (const auto& [key, v] : c.metadata) {
    ENGINE_CHECK(key.starts_with("counter:"), path + ": unexpected metadata key '" + key + "'");
    state.counters[key.substr(8)] = std::stoll(v);
  }
  return state;
}

}  // namespace replay
