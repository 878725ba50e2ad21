// The OSFT golden trajectories (tests/fixtures/golden/osft, one process) replayed with every tensor
// in a Backend's memory, the way a training step on a device runs them: the SVD split into the
// backend's memory, the chain rule, clipping, the gradient projection, AdamW and the parameter
// projection as Backend operations, and the dense weight rebuilt from the factors. On the CPU
// backend here; on the CUDA backend where a device exists (skipped without one).
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "core/backend.h"
#include "core/compare.h"
#include "core/safetensors.h"
#include "optim/hyper_reader.h"
#include "optim/osft/osft.h"
#include "optim/osft/osft_factors.h"
#include "optim/registry.h"

namespace {

// The golden README's tolerance for factors, parameters and state.
constexpr double kAtol = 1e-4;
constexpr const char* kTrained[] = {"U_low", "S_low", "V_low"};

core::Tensor download(core::Backend& backend, const core::Tensor& t) {
  core::Tensor host = core::Tensor::empty(t.shape());
  if (t.numel() > 0) backend.copy_to_host(host.raw_data(), t.raw_data(), t.nbytes());
  return host;
}

core::Tensor device_zeros(core::Backend& backend, const core::Shape& shape) {
  core::Tensor t = core::Tensor::empty(shape, core::DType::F32, backend.allocator());
  backend.fill_zero(t.raw_data(), t.nbytes());
  return t;
}

class OsftDeviceRun {
 public:
  OsftDeviceRun(core::Backend& backend, const std::string& path) : backend_(backend), file_(path) {
    const YAML::Node hyper = YAML::Load(file_.metadata_value("hyperparameters"));
    steps_ = std::stoll(file_.metadata_value("steps"));
    YAML::Node group(YAML::NodeType::Map);
    for (const char* key : {"unfreeze_rank_ratio", "lr", "betas", "eps", "weight_decay"})
      group[key] = hyper[key];
    group["project_params"] = hyper["post_step_param_projection"];
    if (hyper["grad_clip_max_norm"] && !hyper["grad_clip_max_norm"].IsNull())
      clip_ = hyper["grad_clip_max_norm"].as<double>();
    group = YAML::Load(YAML::Dump(group));
    optim::HyperReader reader(group, path + " (osft)");
    owned_ = optim::Registry::global().create("osft", reader);
    osft_ = dynamic_cast<optim::Osft*>(owned_.get());
    osft_->set_communicator(nullptr, nullptr, backend_);

    std::vector<optim::OsftTargetWeight> weights;
    for (const YAML::Node& p : YAML::Load(file_.metadata_value("params"))) {
      const std::string name = p["name"].as<std::string>();
      const int64_t rows = p["shape"][0].as<int64_t>(), cols = p["shape"][1].as<int64_t>();
      weights.push_back(
          {name, file_.read("init/" + name), osft_->config().k_high_for(name, rows, cols)});
    }
    full_ = optim::osft_decompose_all(weights, nullptr, backend_);
    for (size_t i = 0; i < weights.size(); ++i) {
      Target t;
      t.name = weights[i].name;
      t.rows = weights[i].weight.size(0);
      t.cols = weights[i].weight.size(1);
      t.k_high = weights[i].k_high;
      for (const char* f : optim::kOsftFactorNames) {
        const std::string key = "init/" + t.name + "." + f;
        worst_ = std::max(worst_, diff(optim::factor_by_name(full_[i], f), key));
      }
      const optim::OsftFactors& f = full_[i];
      t.grads = {device_zeros(backend_, f.U_low.shape()), device_zeros(backend_, f.S_low.shape()),
                 device_zeros(backend_, f.V_low.shape())};
      t.dense = core::Tensor::empty({t.rows, t.cols}, core::DType::F32, backend_.allocator());
      t.dw = core::Tensor::empty({t.rows, t.cols}, core::DType::F32, backend_.allocator());
      osft_->add_target(t.name, t.rows, t.cols, t.k_high, f.U_high, f.V_high);
      targets_.push_back(std::move(t));
    }
  }

  int64_t total_steps() const { return steps_; }
  optim::Osft& optimizer() { return *osft_; }

  // Steps first..last; returns the worst max |ours - reference| over every comparison so far
  // (the decomposition included).
  double steps(int64_t first, int64_t last) {
    for (int64_t t = first; t <= last; ++t)
      step(t);
    return worst_;
  }

  // The trained factors, on the host, in target order (U_low, S_low, V_low each).
  std::vector<core::Tensor> values() const {
    std::vector<core::Tensor> out;
    for (size_t i = 0; i < targets_.size(); ++i)
      for (const char* f : kTrained)
        out.push_back(download(backend_, optim::factor_by_name(full_[i], f)));
    return out;
  }
  void set_values(const std::vector<core::Tensor>& host) {
    size_t j = 0;
    for (size_t i = 0; i < targets_.size(); ++i)
      for (const char* f : kTrained) {
        const core::Tensor& v = optim::factor_by_name(full_[i], f);
        backend_.copy_from_host(v.raw_data(), host.at(j++).raw_data(), v.nbytes());
      }
  }

 private:
  struct Target {
    std::string name;
    int64_t rows = 0, cols = 0, k_high = 0;
    optim::OsftLowGrads grads;
    core::Tensor dense, dw;
  };

  double diff(const core::Tensor& ours, const std::string& key) const {
    const core::Tensor ref = file_.read(key);
    EXPECT_EQ(ours.numel(), ref.numel()) << key;
    if (ours.numel() != ref.numel()) return INFINITY;
    const core::Tensor host = download(backend_, ours);
    const double d = core::compare(host.data<float>(), ref.data<float>(), ref.numel()).max_abs();
    return std::isnan(d) ? INFINITY : d;
  }
  void check(const core::Tensor& ours, const std::string& key) {
    const double d = diff(ours, key);
    EXPECT_LE(d, kAtol) << key << " on " << backend_.name();
    worst_ = std::max(worst_, d);
  }

  void step(int64_t t) {
    const std::string ts = std::to_string(t) + "/";
    std::vector<std::span<const float>> all;
    for (size_t i = 0; i < targets_.size(); ++i) {
      Target& x = targets_[i];
      for (const core::Tensor* g : {&x.grads.U_low, &x.grads.S_low, &x.grads.V_low}) {
        backend_.fill_zero(g->raw_data(), g->nbytes());
        all.emplace_back(g->data<float>(), static_cast<size_t>(g->numel()));
      }
      const core::Tensor dw = file_.read("grad/" + ts + x.name + ".dW");
      backend_.copy_from_host(x.dw.raw_data(), dw.raw_data(), dw.nbytes());
      optim::osft_add_factor_grads(*optim::make_osft_ops(backend_), full_[i], x.dw, x.grads);
      check(x.grads.U_low, "grad/" + ts + x.name + ".U_low");
      check(x.grads.S_low, "grad/" + ts + x.name + ".S_low");
      check(x.grads.V_low, "grad/" + ts + x.name + ".V_low");
    }
    const double norm = std::sqrt(backend_.sum_squares_many(all));
    if (clip_ > 0 && norm > clip_) {
      const auto scale = static_cast<float>(clip_ / (norm + 1e-6));  // torch clip_grad_norm_
      for (Target& x : targets_) {
        const core::Tensor* g[] = {&x.grads.U_low, &x.grads.S_low, &x.grads.V_low};
        for (size_t j = 0; j < 3; ++j) {
          backend_.scale(g[j]->data<float>(), scale, g[j]->numel());
          check(*g[j], "grad_clipped/" + ts + x.name + "." + kTrained[j]);
        }
      }
    }
    std::vector<optim::ParamShard> parts;
    for (size_t i = 0; i < targets_.size(); ++i) {
      const Target& x = targets_[i];
      const core::Tensor* g[] = {&x.grads.U_low, &x.grads.S_low, &x.grads.V_low};
      for (size_t j = 0; j < 3; ++j) {
        const core::Tensor& value = optim::factor_by_name(full_[i], kTrained[j]);
        parts.push_back({x.name + "." + kTrained[j], value.shape(), 0, value, *g[j]});
      }
    }
    optim::StepContext ctx;
    ctx.step = t;
    ctx.total_steps = steps_;
    ctx.backend = &backend_;
    osft_->step(parts, ctx);
    for (size_t i = 0; i < targets_.size(); ++i) {
      Target& x = targets_[i];
      for (const char* f : kTrained)
        check(optim::factor_by_name(full_[i], f), "param/" + ts + x.name + "." + f);
      optim::osft_reconstruct_into(*optim::make_osft_ops(backend_), full_[i], x.dense, 0);
      check(x.dense, "param/" + ts + x.name);
    }
  }

  core::Backend& backend_;
  core::SafetensorsReader file_;
  int64_t steps_ = 0;
  double clip_ = 0;
  std::unique_ptr<optim::Optimizer> owned_;
  optim::Osft* osft_ = nullptr;
  std::vector<optim::OsftFactors> full_;  // in the backend's memory
  std::vector<Target> targets_;
  double worst_ = 0;
};

using Case = std::tuple<std::string, std::string>;  // backend, golden file

class OsftDeviceReplay : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const auto& [kind, file] = GetParam();
    backend_ = &core::cpu_backend();
    if (kind == "cuda") {
      if (!core::cuda_available()) GTEST_SKIP() << "no CUDA device";
      cuda_ = core::make_cuda_backend(0);
      backend_ = cuda_.get();
    }
    path_ = std::string(ENGINE_GOLDEN_DIR) + "/osft/" + file;
  }

  std::unique_ptr<core::Backend> cuda_;  // outlives every tensor of a test
  core::Backend* backend_ = nullptr;
  std::string path_;
};

TEST_P(OsftDeviceReplay, StaysWithinTheGoldenTolerance) {
  OsftDeviceRun run(*backend_, path_);
  EXPECT_LE(run.steps(1, run.total_steps()), kAtol) << path_ << " on " << backend_->name();
}

// The first steps on the CPU, the factors and the AdamW moments handed over as host tensors
// (what a checkpoint holds), the rest on the backend; on the CPU bit for bit the uninterrupted
// run.
TEST_P(OsftDeviceReplay, ResumesFromHostState) {
  OsftDeviceRun first(core::cpu_backend(), path_);
  const int64_t steps = first.total_steps(), half = steps / 2;
  ASSERT_GE(half, 1);
  first.steps(1, half);
  optim::OptimizerState state;
  first.optimizer().save_state(state);
  OsftDeviceRun resumed(*backend_, path_);
  resumed.set_values(first.values());
  resumed.optimizer().load_state(state);
  EXPECT_LE(resumed.steps(half + 1, steps), kAtol) << path_ << " on " << backend_->name();
  if (!backend_->device().is_cpu()) return;
  OsftDeviceRun whole(*backend_, path_);
  whole.steps(1, steps);
  const std::vector<core::Tensor> a = resumed.values(), b = whole.values();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(std::memcmp(a[i].raw_data(), b[i].raw_data(), a[i].nbytes()), 0) << i;
}

INSTANTIATE_TEST_SUITE_P(
    Osft, OsftDeviceReplay,
    ::testing::Combine(::testing::Values("cpu", "cuda"),
                       ::testing::Values("osft_sq32.safetensors", "osft_wide24x64.safetensors",
                                         "osft_tall64x16_noparamproj.safetensors",
                                         "osft_sharded.safetensors")),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string name = std::get<0>(info.param) + "_" + std::get<1>(info.param);
      return name.substr(0, name.rfind('.'));
    });

}  // namespace
