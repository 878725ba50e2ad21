// The elementwise and Muon-family golden trajectories replayed with parameters, gradients and
// optimizer state in a Backend's memory, the way a training step on a device runs them: on the
// CPU backend here (which checks this harness against the same tolerance optim_replay uses), on
// the CUDA backend where a device exists (skipped without one).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "apps/optim_replay/golden_case.h"
#include "core/backend.h"
#include "core/compare.h"

namespace {

core::Tensor upload(core::Backend& backend, const core::Tensor& host) {
  core::Tensor t = core::Tensor::empty(host.shape(), core::DType::F32, backend.allocator());
  backend.copy_from_host(t.raw_data(), host.raw_data(), host.nbytes());
  return t;
}

core::Tensor download(core::Backend& backend, const core::Tensor& t) {
  core::Tensor host = core::Tensor::empty(t.shape());
  backend.copy_to_host(host.raw_data(), t.raw_data(), t.nbytes());
  return host;
}

// Parameters on a backend, stepped through golden steps with the file's gradients.
class DeviceRun {
 public:
  DeviceRun(core::Backend& backend, const replay::GoldenCase& golden)
      : backend_(backend), golden_(golden), set_(golden.groups, golden.params) {
    for (const comm::ParamDesc& p : golden.params) {
      values_.push_back(upload(backend, golden.file->read("init/" + p.name)));
      grads_.push_back(core::Tensor::empty(p.shape, core::DType::F32, backend.allocator()));
    }
  }

  optim::OptimizerSet& optimizers() { return set_; }

  // Steps first..last; returns the worst max |ours - reference| over those steps.
  double steps(int64_t first, int64_t last) {
    double worst = 0;
    for (int64_t t = first; t <= last; ++t) {
      std::vector<optim::ParamShard> parts;
      for (size_t i = 0; i < golden_.params.size(); ++i) {
        const comm::ParamDesc& p = golden_.params[i];
        const core::Tensor g = golden_.file->read("grad/" + std::to_string(t) + "/" + p.name);
        backend_.copy_from_host(grads_[i].raw_data(), g.raw_data(), g.nbytes());
        parts.push_back({p.name, p.shape, 0, values_[i], grads_[i]});
      }
      optim::StepContext ctx;
      ctx.step = t;
      ctx.total_steps = golden_.steps;
      ctx.backend = &backend_;
      set_.step(parts, ctx);
      for (size_t i = 0; i < golden_.params.size(); ++i) {
        const std::string& name = golden_.params[i].name;
        const core::Tensor ours = download(backend_, values_[i]);
        const core::Tensor ref = golden_.file->read("param/" + std::to_string(t) + "/" + name);
        const core::Difference d =
            core::compare(ours.data<float>(), ref.data<float>(), ref.numel());
        if (!(d.max_abs() <= worst)) worst = d.max_abs();  // a NaN sticks
      }
    }
    return worst;
  }

  // The current parameters, on the host.
  std::vector<core::Tensor> values() const {
    std::vector<core::Tensor> out;
    for (const core::Tensor& v : values_)
      out.push_back(download(backend_, v));
    return out;
  }
  void set_values(const std::vector<core::Tensor>& host) {
    for (size_t i = 0; i < values_.size(); ++i)
      backend_.copy_from_host(values_[i].raw_data(), host[i].raw_data(), host[i].nbytes());
  }

 private:
  core::Backend& backend_;
  const replay::GoldenCase& golden_;
  optim::OptimizerSet set_;  // its state lives in the backend's memory
  std::vector<core::Tensor> values_, grads_;
};

// backend, golden file (optionally "FILE|key=value" with a setting applied to every group)
using Case = std::tuple<std::string, std::string>;

class DeviceReplay : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const auto& [kind, file] = GetParam();
    backend_ = &core::cpu_backend();
    if (kind == "cuda") {
      if (!core::cuda_available()) GTEST_SKIP() << "no CUDA device";
      cuda_ = core::make_cuda_backend(0);
      backend_ = cuda_.get();
    }
    const size_t bar = file.find('|');
    std::string path = std::string(ENGINE_GOLDEN_DIR) + "/";
    path.append(file, 0, bar);
    std::vector<std::string> sets;
    if (bar != std::string::npos) sets.push_back(file.substr(bar + 1));
    golden_ = replay::load_golden(path, "", sets);
  }
  void expect_within_tolerance(double worst) const {
    EXPECT_TRUE(core::within(worst, golden_.suggested_atol))
        << golden_.path << " on " << backend_->name() << ": worst max_abs " << worst
        << " above suggested_atol " << golden_.suggested_atol;
  }

  std::unique_ptr<core::Backend> cuda_;  // outlives every tensor of a test
  core::Backend* backend_ = nullptr;
  replay::GoldenCase golden_;
};

TEST_P(DeviceReplay, StaysWithinTheGoldenTolerance) {
  DeviceRun run(*backend_, golden_);
  expect_within_tolerance(run.steps(1, golden_.steps));
}

// The first half on the CPU, the optimizer state handed over as host tensors (what a checkpoint
// holds), the rest on the backend; on the CPU bit for bit the uninterrupted run.
TEST_P(DeviceReplay, ResumesFromHostState) {
  ASSERT_GE(golden_.steps, 2);
  const int64_t half = golden_.steps / 2;
  DeviceRun first(core::cpu_backend(), golden_);
  first.steps(1, half);
  DeviceRun resumed(*backend_, golden_);
  resumed.set_values(first.values());
  resumed.optimizers().load_state(first.optimizers().state());
  expect_within_tolerance(resumed.steps(half + 1, golden_.steps));
  if (!backend_->device().is_cpu()) return;
  DeviceRun whole(*backend_, golden_);
  whole.steps(1, golden_.steps);
  const std::vector<core::Tensor> a = resumed.values(), b = whole.values();
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(std::memcmp(a[i].raw_data(), b[i].raw_data(), a[i].nbytes()), 0)
        << golden_.params[i].name;
}

// Every golden file of the optimizers whose whole step is Backend operations. The SOAP family:
// SOAP by eigh and by QR power iteration, KL-Shampoo with Nesterov, the amortized refresh (warm-up,
// frequency, qr_sort before, the adaptive criterion), 1-D and max_precond_dim, REKLS with l2
// decay, StackedSoap's permuted 3-D stack, and TpRekls on one rank (replicated: the sharded
// groups need a communicator, which the multi-rank replays give them).
INSTANTIATE_TEST_SUITE_P(
    Optimizers, DeviceReplay,
    ::testing::Combine(
        ::testing::Values("cpu", "cuda"),
        ::testing::Values(
            "adamw/distadam_basic.safetensors", "adamw/eps_and_multipliers.safetensors",
            "adam_cwd/mixed.safetensors", "muon/split_qkv_multipliers.safetensors",
            "muon/square.safetensors", "muon/tall_wide.safetensors",
            "normuon/split_qkv_multipliers.safetensors", "normuon/tall_wide_square.safetensors",
            "normuon/record89_head_pairs.safetensors", "adam_cwd/every_other_step.safetensors",
            "adam_cwd/tied_untie.safetensors", "soap/soap_eigh_2d.safetensors",
            "soap/soap_qr_square.safetensors", "soap/soap_qr_kl_nesterov_pow2.safetensors",
            "soap/soap_amortized_freq2_warmup1_qr.safetensors",
            "soap/soap_amortized_adaptive_eigh.safetensors",
            "soap/soap_reference_maxdim_1d.safetensors", "rekls/rekls_2d.safetensors",
            "rekls/rekls_l2_wd.safetensors",
            "stacked_soap/stacked_soap_3d_square_stack.safetensors",
            "tp_rekls/tp_rekls_ws2.safetensors|partition_dim=none")),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string name = std::get<0>(info.param) + "_" + std::get<1>(info.param);
      name = name.substr(0, name.rfind('.'));
      for (char& c : name)
        if (c == '/') c = '_';
      if (name.ends_with("_ws2")) name += "_replicated";
      return name;
    });

}  // namespace
