// The SOAP family on one process: the batched eigenbasis refresh equals the one-at-a-time refresh
// bit for bit (also when the adaptive criterion skips every refresh, the case the reference's
// batched code gets wrong), StackedSoap on 2-D parameters equals SOAP, save/load resumes bit
// for bit, and bad hyperparameters are refused naming the group and the key.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "optim/optimizer_set.h"
#include "tests/test_util.h"

namespace {

using comm::ParamDesc;
using optim::OptimizerSet;
using test_util::error_of;

// Equal shapes side by side (batched solves of equal size), rectangular ones, a stack.
const std::vector<ParamDesc> kParams = {
    {"blocks.0.attn.proj.weight", {16, 16}},
    {"blocks.1.attn.proj.weight", {16, 16}},
    {"blocks.0.mlp.fc.weight", {24, 16}},
    {"blocks.0.mlp.proj.weight", {16, 24}},
    {"blocks.0.bias", {12}},
};

// Runs `steps` steps of the groups over kParams (or `params`) from fixed values and gradients;
// returns the final values followed by every state tensor, in a fixed order.
struct Trajectory {
  std::vector<core::Tensor> values;
  optim::OptimizerState state;
};

Trajectory run(const std::string& yaml, int steps, const std::vector<ParamDesc>& params = kParams,
               const optim::OptimizerState* resume_from = nullptr, int first_step = 1,
               std::vector<core::Tensor> start = {}) {
  OptimizerSet set(YAML::Load(yaml), params);
  if (resume_from) set.load_state(*resume_from);
  Trajectory out;
  for (size_t i = 0; i < params.size(); ++i) {
    if (start.empty()) {
      out.values.push_back(core::Tensor::empty(params[i].shape));
      core::fill_normal(out.values.back(), 7 + i, 0.0f, 1.0f);
    } else {
      out.values.push_back(start[i].clone());
    }
  }
  for (int t = first_step; t < first_step + steps; ++t) {
    std::vector<core::Tensor> grads;
    std::vector<optim::ParamShard> shards;
    for (size_t i = 0; i < params.size(); ++i) {
      grads.push_back(core::Tensor::empty(params[i].shape));
      core::fill_normal(grads.back(), 1000 * t + i, 0.0f, 1.0f);
      shards.push_back({params[i].name, params[i].shape, 0, out.values[i], grads[i]});
    }
    optim::StepContext ctx;
    ctx.backend = &core::cpu_backend();
    ctx.step = t;
    set.step(shards, ctx);
  }
  out.state = set.state();
  return out;
}

bool same_bits(const core::Tensor& a, const core::Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

void expect_same(const Trajectory& a, const Trajectory& b, const std::string& what) {
  ASSERT_EQ(a.values.size(), b.values.size());
  for (size_t i = 0; i < a.values.size(); ++i)
    EXPECT_TRUE(same_bits(a.values[i], b.values[i])) << what << ": parameter " << i;
  ASSERT_EQ(a.state.tensors.size(), b.state.tensors.size()) << what;
  for (const auto& [key, t] : a.state.tensors)
    EXPECT_TRUE(same_bits(t, b.state.tensors.at(key))) << what << ": state " << key;
  EXPECT_EQ(a.state.counters, b.state.counters) << what;
}

bool any_differs(const Trajectory& a, const Trajectory& b) {
  for (size_t i = 0; i < a.values.size(); ++i)
    if (!same_bits(a.values[i], b.values[i])) return true;
  return false;
}

std::string group(const std::string& settings) {
  return "- {params: ['*'], optimizer: soap, lr: 0.01, eps: 0.1, precondition_1d: true, " +
         settings + "}";
}

TEST(SoapBatchedRefresh, EqualsOneAtATimeBitForBit) {
  for (const std::string s :
       {"use_eigh: true", "use_eigh: false",
        "use_eigh: false, power_iter_steps: 2, qr_sort: before",
        "use_eigh: false, precondition_frequency: 2, adam_warmup_steps: 1",
        "use_eigh: true, use_adaptive_criteria: true, adaptive_update_tolerance: 0.02"}) {
    const Trajectory batched = run(group(s + ", batched_refresh: true"), 5);
    const Trajectory single = run(group(s + ", batched_refresh: false"), 5);
    expect_same(batched, single, s);
  }
  // KL factors need two sides: matrices only.
  const std::vector<ParamDesc> matrices(kParams.begin(), kParams.end() - 1);
  for (const std::string s : {"use_eigh: true", "use_eigh: false"}) {
    const std::string kl = s + ", use_kl_shampoo: true";
    expect_same(run(group(kl + ", batched_refresh: true"), 5, matrices),
                run(group(kl + ", batched_refresh: false"), 5, matrices), kl);
  }
}

// Tolerance 0.9: from the second step on every factor meets the criterion, so no refresh runs
// and M must stay in the eigen coordinates it was in. That is exactly a run whose only refresh is
// the first one (a frequency beyond the run): bit for bit, batched and one at a time. The
// reference's batched QR code rotates M out and never back in this case.
TEST(SoapBatchedRefresh, AllFactorsSkippedKeepsMomentInEigenCoordinates) {
  for (const char* path : {"use_eigh: false", "use_eigh: true"}) {
    const std::string base = std::string(path) + ", batched_refresh: ";
    const std::string skip = ", use_adaptive_criteria: true, adaptive_update_tolerance: 0.9";
    const Trajectory only_first = run(group(base + "true, precondition_frequency: 1000"), 6);
    const Trajectory batched = run(group(base + "true" + skip), 6);
    const Trajectory single = run(group(base + "false" + skip), 6);
    expect_same(batched, only_first, std::string(path) + " batched, all skipped");
    expect_same(single, only_first, std::string(path) + " one at a time, all skipped");
    // And the criterion is not vacuous: every-step refreshes give another trajectory.
    EXPECT_TRUE(any_differs(run(group(base + "true"), 6), only_first)) << path;
  }
}

TEST(StackedSoap, TwoDimensionalParametersEqualSoap) {
  const std::vector<ParamDesc> matrices(kParams.begin(), kParams.end() - 1);
  const std::string common = "lr: 0.01, eps: 0.1, use_kl_shampoo: true}";
  expect_same(run("- {params: ['*'], optimizer: stacked_soap, " + common, 5, matrices),
              run("- {params: ['*'], optimizer: soap, " + common, 5, matrices),
              "stacked_soap vs soap");
}

TEST(Soap, SaveLoadResumesBitForBit) {
  const std::vector<ParamDesc> matrices(kParams.begin(), kParams.end() - 1);
  std::vector<ParamDesc> with_stack = matrices;
  with_stack.push_back({"experts", {3, 8, 4}});
  const std::pair<const char*, std::vector<ParamDesc>> cases[] = {
      {"soap, precondition_1d: true", kParams},
      {"stacked_soap", with_stack},
      {"rekls", matrices},
  };
  for (const auto& [opt, params] : cases) {
    const std::string yaml =
        std::string("- {params: ['*'], optimizer: ") + opt + ", lr: 0.01, eps: 0.1}";
    const Trajectory whole = run(yaml, 6, params);
    const Trajectory first = run(yaml, 3, params);
    const Trajectory resumed = run(yaml, 3, params, &first.state, 4, first.values);
    expect_same(resumed, whole, opt);
    const Trajectory fresh = run(yaml, 3, params, nullptr, 4, first.values);
    EXPECT_TRUE(any_differs(fresh, whole)) << opt << ": dropping the state changes nothing";
  }
}

TEST(Soap, BadHyperparametersNameGroupAndKey) {
  struct Case {
    std::string yaml;
    const char* message;
    const char* where = "optimizer group 0";
  };
  const std::string adamw = "\n- {params: ['*'], optimizer: adamw}";
  const Case cases[] = {
      {"- {params: ['*.weight'], optimizer: soap, lr: 0.1, betas: [-0.9, 0.95]}" + adamw,
       "optimizer group 0 (soap): 'betas' beta1 must be in [0, 1) (line 1)"},
      {"- {params: ['*.weight'], optimizer: soap, lr: 0.1, weight_decay_method: ridge}" + adamw,
       "optimizer group 0 (soap): 'weight_decay_method' must be one of decoupled, independent, "
       "l2, palm, got 'ridge'"},
      {"- {params: ['*'], optimizer: soap, lr: 0.1}",
       "soap: parameter 'blocks.0.bias' [12] is 1-D: set 'precondition_1d: true' in its group "
       "or route it to adamw",
       "[optimizer group 0, line 1]"},
      {"- {params: ['*.weight'], optimizer: soap}" + adamw,
       "optimizer group 0 (soap): missing 'lr'"},
      {"- {params: ['*.weight'], optimizer: soap, lr: 0.1, shampoo_beta: 1.5}" + adamw,
       "optimizer group 0 (soap): 'shampoo_beta' must be in [0, 1)"},
      {"- {params: ['*.weight'], optimizer: soap, lr: 0.1, qr_sort: middle}" + adamw,
       "'qr_sort' must be one of after, before, got 'middle'"},
      {"- {params: ['*.weight'], optimizer: rekls, lr: 0.1, use_eigh: false}" + adamw,
       "optimizer group 0 (rekls): 'use_eigh' is fixed by rekls"},
      {"- {params: ['*.weight'], optimizer: tp_rekls, lr: 0.1, partition_dim: 2}" + adamw,
       "optimizer group 0 (tp_rekls): 'partition_dim' must be 0 (rows), 1 (columns) or none"},
      {"- {params: ['*.weight'], optimizer: soap, lr: 0.1, power_iter_steps: 0}" + adamw,
       "'power_iter_steps' must be >= 1"},
      {"- {params: ['*.weight'], optimizer: soap, lr: 0.1, use_kl_shampoo: true, "
       "max_precond_dim: 20}" +
           adamw,
       "use_kl_shampoo needs both Kronecker factors"},
  };
  for (const Case& c : cases) {
    const std::string err = error_of([&] { OptimizerSet set(YAML::Load(c.yaml), kParams); });
    EXPECT_NE(err.find(c.message), std::string::npos) << c.yaml << "\n -> " << err;
    EXPECT_NE(err.find(c.where), std::string::npos) << c.yaml << "\n -> " << err;
  }
  const std::vector<ParamDesc> stack = {{"experts", {2, 4, 4}}};
  const std::string err = error_of(
      [&] { OptimizerSet set(YAML::Load("- {params: ['*'], optimizer: soap, lr: 0.1}"), stack); });
  EXPECT_NE(err.find("is 3-D: route it to stacked_soap"), std::string::npos) << err;
}

// max_precond_dim: a side above it has no factor (its state slots do not exist) and the update
// is the one-sided rotation; 1-D parameters above it get plain Adam.
TEST(Soap, MaxPrecondDimLeavesLongSidesUnpreconditioned) {
  const Trajectory t = run(group("max_precond_dim: 16"), 2);
  EXPECT_TRUE(t.state.tensors.count("blocks.0.mlp.fc.weight/factor_right"));
  EXPECT_FALSE(t.state.tensors.count("blocks.0.mlp.fc.weight/factor_left"));
  EXPECT_TRUE(t.state.tensors.count("blocks.0.bias/factor_left"));
  const Trajectory small = run(group("max_precond_dim: 8"), 2);
  EXPECT_FALSE(small.state.tensors.count("blocks.0.bias/factor_left"));
}

}  // namespace
