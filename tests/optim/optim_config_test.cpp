// Registry, strict hyperparameter schema, parameter groups and the preset.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <memory>
#include <span>
#include <string>

#include "core/check.h"
#include "core/rng.h"
#include "optim/adamw/adamw.h"
#include "optim/glob.h"
#include "optim/muon/muon.h"
#include "optim/optimizer_set.h"
#include "optim/registry.h"
#include "tests/optim/cpu_context.h"
#include "tests/test_util.h"

using test_util::error_of;

using comm::ParamDesc;
using optim::OptimizerSet;

namespace {

const std::vector<ParamDesc> kParams = {
    {"embed.weight", {64, 16}},
    {"blocks.0.attn.qkv.weight", {48, 16}},
    {"blocks.0.attn.proj.weight", {16, 16}},
    {"blocks.0.ln1.weight", {16}},
    {"lm_head.weight", {64, 16}},
};

}  // namespace

TEST(Glob, StarsAndQuestionMarks) {
  EXPECT_TRUE(optim::glob_match("blocks.*.attn.qkv.weight", "blocks.11.attn.qkv.weight"));
  EXPECT_TRUE(optim::glob_match("*", "anything.at.all"));
  EXPECT_TRUE(optim::glob_match("*.weight", "a.b.weight"));
  EXPECT_TRUE(optim::glob_match("blocks.?.ln1.*", "blocks.3.ln1.bias"));
  EXPECT_FALSE(optim::glob_match("blocks.?.ln1.*", "blocks.12.ln1.bias"));
  EXPECT_FALSE(optim::glob_match("*.bias", "a.bias.x"));
  EXPECT_FALSE(optim::glob_match("embed.weight", "pos_embed.weight"));
  EXPECT_TRUE(optim::glob_match("*a*a*a", "aaaa"));
  EXPECT_FALSE(optim::glob_match("*a*a*a*b", "aaaaaaaaaa"));
}

TEST(OptimizerSet, FirstMatchWinsAndPlacementsFollowTheOptimizer) {
  YAML::Node groups = YAML::Load(R"(
- params: ["blocks.*.attn.*.weight"]
  optimizer: muon
  lr: 0.02
- params: ["embed.weight", "blocks.*.attn.qkv.weight"]
  optimizer: adamw
  lr_mul: 75
- params: "*"
  optimizer: adamw
)");
  OptimizerSet set(groups, kParams);
  EXPECT_EQ(set.num_groups(), 3u);
  EXPECT_EQ(set.group_of("blocks.0.attn.qkv.weight"), 0u);  // first match wins
  EXPECT_EQ(set.group_of("embed.weight"), 1u);
  EXPECT_EQ(set.group_of("lm_head.weight"), 2u);
  EXPECT_EQ(set.placement("blocks.0.attn.proj.weight"), comm::Placement::owned());
  EXPECT_EQ(set.placement("blocks.0.ln1.weight"), comm::Placement::shard(0));
  auto& adam = dynamic_cast<optim::AdamW&>(set.optimizer(1));
  EXPECT_EQ(adam.config().lr_mul, 75.0);
  EXPECT_EQ(adam.config().eps, 1e-10);  // the spec's defaults
  EXPECT_FALSE(adam.config().torch_eps);
  auto& muon = dynamic_cast<optim::Muon&>(set.optimizer(0));
  EXPECT_EQ(muon.config().lr, 0.02);
  // Default view: the merged QKV weight is three square blocks.
  const std::vector<optim::MatrixView> views = muon.view_of("blocks.0.attn.qkv.weight", {48, 16});
  ASSERT_EQ(views.size(), 1u);
  const optim::MatrixView& v = views[0];
  EXPECT_EQ(v.count, 3);
  EXPECT_EQ(v.rows, 16);
  EXPECT_EQ(v.cols, 16);
}

// Record #89's QKV weight [3 D, D]: Q and K per head pair ([2 head_dim, D] each), V whole.
TEST(OptimizerSet, MatrixViewsCutQkvIntoHeadPairsAndV) {
  const std::vector<ParamDesc> params = {{"blocks.0.attn.qkv.weight", {48, 16}}};
  OptimizerSet set(YAML::Load("- {params: ['*'], optimizer: normuon,"
                              " matrix_views: {'*.qkv.weight': [[8, 4, 16], [1, 16, 16]]}}"),
                   params);
  auto& muon = dynamic_cast<optim::Muon&>(set.optimizer(0));
  const std::vector<optim::MatrixView> views = muon.view_of("blocks.0.attn.qkv.weight", {48, 16});
  ASSERT_EQ(views.size(), 2u);
  EXPECT_EQ(views[0].count, 8);
  EXPECT_EQ(views[0].rows, 4);
  EXPECT_EQ(views[1].count, 1);
  EXPECT_EQ(views[1].rows, 16);
  EXPECT_EQ(views[1].cols, 16);
}

namespace {

// Records the gradient scale its step was handed.
class ScaleSpy final : public optim::Optimizer {
 public:
  ScaleSpy(bool folds, const float** seen) : folds_(folds), seen_(seen) {}
  const char* kind() const override { return folds_ ? "spy_folds" : "spy_plain"; }
  double lr() const override { return 0; }
  comm::Placement placement() const override { return comm::Placement::shard(0); }
  void check_param(const std::string&, const core::Shape&) const override {}
  bool folds_grad_scale() const override { return folds_; }
  void step(std::span<const optim::ParamShard>, const optim::StepContext& ctx) override {
    *seen_ = ctx.grad_scale;
  }
  void save_state(optim::OptimizerState&) const override {}
  void load_state(const optim::OptimizerState&) override {}

 private:
  bool folds_;
  const float** seen_;
};

}  // namespace

// The trainer's gradient factor reaches only the optimizers that fold it into their update
// (AdamW); the others (Muon, OSFT with its inner AdamW) get gradients already scaled and must
// not see it, or they would scale twice.
TEST(OptimizerSet, GradScaleReachesOnlyTheOptimizersThatFoldIt) {
  const float* folds_saw = nullptr;
  const float* plain_saw = nullptr;
  optim::Registry registry;
  registry.add("spy_folds",
               [&](optim::HyperReader&) { return std::make_unique<ScaleSpy>(true, &folds_saw); });
  registry.add("spy_plain",
               [&](optim::HyperReader&) { return std::make_unique<ScaleSpy>(false, &plain_saw); });
  YAML::Node groups = YAML::Load(R"(
- params: ["blocks.*"]
  optimizer: spy_plain
- params: "*"
  optimizer: spy_folds
)");
  OptimizerSet set(groups, kParams, registry);
  EXPECT_FALSE(set.folds_grad_scale("blocks.0.ln1.weight"));
  EXPECT_TRUE(set.folds_grad_scale("embed.weight"));
  const float factor = 0.5f;
  optim::StepContext ctx;
  ctx.grad_scale = &factor;
  plain_saw = &factor;  // must be cleared by the step
  set.step({}, ctx);
  EXPECT_EQ(folds_saw, &factor);
  EXPECT_EQ(plain_saw, nullptr);
  // The built-in kinds: AdamW folds, Muon does not.
  OptimizerSet builtin(YAML::Load(R"(
- params: ["blocks.*.attn.*.weight"]
  optimizer: muon
- params: "*"
  optimizer: adamw
)"),
                       kParams);
  EXPECT_FALSE(builtin.folds_grad_scale("blocks.0.attn.qkv.weight"));
  EXPECT_TRUE(builtin.folds_grad_scale("lm_head.weight"));
}

TEST(OptimizerSet, UnmatchedParametersAreListed) {
  YAML::Node groups = YAML::Load(R"(
- params: ["blocks.*"]
  optimizer: adamw
)");
  const std::string err = error_of([&] { OptimizerSet set(groups, kParams); });
  EXPECT_NE(err.find("no group matches 2 parameter(s): embed.weight, lm_head.weight"),
            std::string::npos)
      << err;
}

TEST(OptimizerSet, GroupMatchingNoParameterIsRefused) {
  YAML::Node groups = YAML::Load(R"(- params: ["blocks.*.atn.*", "head.weight"]
  optimizer: muon
- params: ["*"]
  optimizer: adamw
)");
  const std::string err = error_of([&] { OptimizerSet set(groups, kParams); });
  EXPECT_NE(err.find("optimizer group 0 (line 1): params 'blocks.*.atn.*', 'head.weight' match no "
                     "parameter of this model"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("named like embed.weight, blocks.0.attn.qkv.weight"), std::string::npos)
      << err;
  // One glob naming something is enough (a config shared by tied and untied heads).
  YAML::Node shared = YAML::Load(R"(- params: ["embed.weight", "no_such.weight"]
  optimizer: adamw
- params: ["*"]
  optimizer: adamw
)");
  EXPECT_NO_THROW(OptimizerSet(shared, kParams));
}

// A group listed after a broader one that takes all its parameters steps nothing: its optimizer
// and hyperparameters never applied, without a word (first match wins). Refused, naming both
// groups; `optional: true` allows it, and so does an "everything else" group that several
// earlier groups left empty (a config shared by model shapes).
TEST(OptimizerSet, GroupLeftWithNoParameterIsRefused) {
  YAML::Node shadowed = YAML::Load(R"(- params: ["*"]
  optimizer: adamw
- params: ["blocks.*.attn.*"]
  optimizer: muon
)");
  const std::string err = error_of([&] { OptimizerSet set(shadowed, kParams); });
  EXPECT_NE(err.find("optimizer group 1 (line 3) is left with no parameter: every parameter its "
                     "params name (e.g. blocks.0.attn.qkv.weight) went to optimizer group 0 (line "
                     "1) listed before it"),
            std::string::npos)
      << err;
  YAML::Node optional = YAML::Load(R"(- params: ["*"]
  optimizer: adamw
- params: ["blocks.*.attn.*"]
  optimizer: muon
  optional: true
)");
  EXPECT_NO_THROW(OptimizerSet(optional, kParams));
  YAML::Node rest = YAML::Load(R"(- params: ["blocks.*.attn.*"]
  optimizer: muon
- params: ["embed.weight", "lm_head.weight", "blocks.*.ln1.*"]
  optimizer: adamw
- params: ["*"]
  optimizer: adamw
)");
  EXPECT_NO_THROW(OptimizerSet(rest, kParams));
}

// A negative weight decay grows the weights, a negative lr_mul or wd_mul turns a step around:
// refused by name for every optimizer that reads them (SOAP's family already was).
// Each optimizer reports the step size in effect: the config's lr, or its default where the group
// gives none (the trainer logs the first group's; it used to read the YAML and log 0 then).
TEST(OptimizerSet, OptimizersReportTheirEffectiveLr) {
  YAML::Node groups = YAML::Load(R"(- params: ["blocks.*.attn.*"]
  optimizer: muon
- params: ["embed.weight"]
  optimizer: adamw
  lr: 0.003
- params: ["*"]
  optimizer: adamw
)");
  OptimizerSet set(groups, kParams);
  EXPECT_DOUBLE_EQ(set.optimizer(0).lr(), optim::MuonConfig{}.lr);
  EXPECT_DOUBLE_EQ(set.optimizer(1).lr(), 0.003);
  EXPECT_DOUBLE_EQ(set.optimizer(2).lr(), optim::AdamWConfig{}.lr);
  EXPECT_GT(optim::AdamWConfig{}.lr, 0);
  EXPECT_GT(optim::MuonConfig{}.lr, 0);
}

TEST(OptimizerSet, NegativeDecayAndMultipliersAreRefused) {
  const char* kGroups[] = {
      "- {params: ['*'], optimizer: adamw, weight_decay: -0.1}",
      "- {params: ['*'], optimizer: adamw, lr_mul: -1}",
      "- {params: ['*'], optimizer: adamw, wd_mul: -1}",
      "- {params: ['blocks.*.attn.*'], optimizer: muon, lr: 0.02, weight_decay: -0.1}\n"
      "- {params: ['*'], optimizer: adamw}",
      "- {params: ['blocks.*.attn.*'], optimizer: muon, lr: 0.02, lr_mul: -2}\n"
      "- {params: ['*'], optimizer: adamw}",
      "- {params: ['blocks.*.attn.*'], optimizer: normuon, lr: 0.02, wd_mul: -2}\n"
      "- {params: ['*'], optimizer: adamw}",
      "- {params: ['blocks.*.attn.*'], optimizer: osft, lr: 0.02, unfreeze_rank_ratio: 0.5, "
      "weight_decay: -0.1}\n"
      "- {params: ['*'], optimizer: adamw}",
      "- {params: ['blocks.*.attn.*'], optimizer: soap, lr: 0.02, weight_decay: -0.1}\n"
      "- {params: ['*'], optimizer: adamw}",
  };
  for (const char* yaml : kGroups) {
    const std::string err = error_of([&] { OptimizerSet set(YAML::Load(yaml), kParams); });
    const bool named = err.find("'weight_decay' must be >= 0") != std::string::npos ||
                       err.find("'lr_mul' must be >= 0") != std::string::npos ||
                       err.find("'wd_mul' must be >= 0") != std::string::npos;
    EXPECT_TRUE(named) << yaml << "\n -> " << err;
  }
}

// AdamW with eps 0 divides 0 by 0 where a gradient has been 0 so far; it was accepted and the
// run diverged later.
TEST(OptimizerSet, AdamWEpsOfZeroIsRefused) {
  for (const char* yaml :
       {"- {params: ['*'], optimizer: adamw, eps: 0}",
        "- {params: ['*'], optimizer: adamw, eps: -1.0e-8}",
        "- {params: ['blocks.*.attn.*'], optimizer: osft, lr: 0.02, "
        "unfreeze_rank_ratio: 0.5, eps: 0}\n- {params: ['*'], optimizer: adamw}"}) {
    const std::string err = error_of([&] { OptimizerSet set(YAML::Load(yaml), kParams); });
    EXPECT_NE(
        err.find("'eps' must be > 0 (it keeps the update finite where the second moment is 0)"),
        std::string::npos)
        << yaml << "\n -> " << err;
  }
  EXPECT_NO_THROW(
      OptimizerSet(YAML::Load("- {params: ['*'], optimizer: adamw, eps: 1.0e-30}"), kParams));
}

TEST(OptimizerSet, UnknownHyperparameterNamesKeyAndLine) {
  YAML::Node groups = YAML::Load(R"(- params: ["*"]
  optimizer: adamw
  lr: 0.01
  beta1: 0.9
)");
  const std::string err = error_of([&] { OptimizerSet set(groups, kParams); });
  EXPECT_NE(err.find("optimizer group 0 (adamw): unknown hyperparameter 'beta1' (line 4)"),
            std::string::npos)
      << err;
}

TEST(OptimizerSet, MistypedHyperparametersAreErrors) {
  struct Case {
    const char* yaml;
    const char* message;
  };
  const Case cases[] = {
      {"- {params: ['*'], optimizer: adamw, lr: fast}", "'lr' must be a number, got 'fast'"},
      {"- {params: ['*'], optimizer: adamw, betas: [0.9]}", "'betas' must be a list of two"},
      {"- {params: ['*'], optimizer: adamw, betas: 0.9}", "'betas' must be a list of numbers"},
      // YAML's .nan and .inf parse as numbers; a NaN lr passed "lr < 0" and trained on NaNs.
      {"- {params: ['*'], optimizer: adamw, lr: .nan}", "'lr' must be a finite number, got '.nan'"},
      {"- {params: ['*'], optimizer: adamw, eps: .inf}", "'eps' must be a finite number"},
      {"- {params: ['*'], optimizer: adamw, betas: [0.9, .NaN]}",
       "'betas' must be a list of finite numbers, got '.NaN'"},
      {"- {params: ['blocks.*.attn.*'], optimizer: muon, momentum: -.inf}\n"
       "- {params: ['*'], optimizer: adamw}",
       "'momentum' must be a finite number"},
      {"- {params: ['*'], optimizer: adamw, eps_mode: numpy}", "'eps_mode' must be 'spec' or"},
      {"- {params: ['blocks.*.attn.*'], optimizer: muon, nesterov: maybe}\n"
       "- {params: ['*'], optimizer: adamw}",
       "'nesterov' must be true or false"},
      {"- {params: ['blocks.*.attn.*'], optimizer: muon, ns_steps: 2.5}\n"
       "- {params: ['*'], optimizer: adamw}",
       "'ns_steps' must be an integer"},
      {"- {params: ['*'], optimizer: lion}",
       "unknown optimizer 'lion' (known: adamw, muon, normuon, osft, rekls, soap, stacked_soap, "
       "tp_rekls)"},
      {"- {params: ['*'], lr: 1}", "missing 'optimizer'"},
      {"- {optimizer: adamw}", "missing 'params'"},
      {"- {params: ['*'], optimizer: muon}",
       "muon: parameter 'blocks.0.ln1.weight' of shape [16] is not a matrix"},
      {"- {params: ['*.qkv.weight'], optimizer: muon, matrix_views: {'*.qkv.weight': 5}}\n"
       "- {params: ['*'], optimizer: adamw}",
       "into 5 row blocks but its rows do not divide"},
      {"- {params: ['*.qkv.weight'], optimizer: muon, matrix_views: {'*.qkv.weight': [2, 8, 8]}}\n"
       "- {params: ['*'], optimizer: adamw}",
       "does not fit 'blocks.0.attn.qkv.weight'"},
      {"- {params: ['*.qkv.weight'], optimizer: muon,"
       " matrix_views: {'*.qkv.weight': [[2, 8, 16], [1, 16, 15]]}}\n"
       "- {params: ['*'], optimizer: adamw}",
       "matrix view [2, 8, 16], [1, 16, 15] does not fit 'blocks.0.attn.qkv.weight' [48, 16] (496 "
       "elements against 768)"},
      {"- {params: ['embed.weight'], optimizer: adamw, tied_to: lm_head.weight, untie_step: 3}\n"
       "- {params: ['*'], optimizer: adamw, update_every: 2}",
       "tied_to 'lm_head.weight': untie_step 3 is not an update step of its group (update_every "
       "2)"},
      {"- {params: ['embed.weight'], optimizer: adamw, tied_to: head.weight}\n"
       "- {params: ['*'], optimizer: adamw}",
       "tied_to 'head.weight' names no parameter of this model"},
      {"- {params: ['embed.weight'], optimizer: adamw, tied_to: blocks.0.attn.proj.weight}\n"
       "- {params: ['*'], optimizer: adamw}",
       "tied_to 'blocks.0.attn.proj.weight' has shape [16, 16], 'embed.weight' [64, 16]"},
      {"- {params: ['embed.weight'], optimizer: adamw, untie_step: 4}\n"
       "- {params: ['*'], optimizer: adamw}",
       "'untie_step' needs tied_to"},
      {"- {params: ['embed.weight'], optimizer: adamw, tied_to: lm_head.weight}\n"
       "- {params: ['lm_head.weight'], optimizer: muon}\n"
       "- {params: ['*'], optimizer: adamw}",
       "both groups must run the same optimizer kind"},
      {"- {params: ['*.qkv.weight'], optimizer: muon, matrix_views: {'*.qkv.weight': [[2, 8]]}}\n"
       "- {params: ['*'], optimizer: adamw}",
       "matrix_views entry '*.qkv.weight' (line 1) must be a positive integer, [k, r, c] or "
       "[[k, r, c], ...]"},
  };
  for (const Case& c : cases) {
    const std::string err = error_of([&] { OptimizerSet set(YAML::Load(c.yaml), kParams); });
    EXPECT_NE(err.find(c.message), std::string::npos) << c.yaml << "\n -> " << err;
  }
}

TEST(OptimizerSet, PresetCoversModernGpt2AndMoeParameterTables) {
  YAML::Node config =
      YAML::LoadFile(std::string(ENGINE_SOURCE_DIR) + "/configs/presets/distadam_muon.yaml");
  const int64_t D = 32, V = 128, F = 128, E = 4, T = 16;
  std::vector<ParamDesc> modern = {{"embed.weight", {V, D}}, {"lm_head.weight", {V, D}}};
  std::vector<ParamDesc> gpt2 = {{"embed.weight", {V, D}},
                                 {"pos_embed.weight", {T, D}},
                                 {"ln_f.weight", {D}},
                                 {"ln_f.bias", {D}}};
  std::vector<ParamDesc> moe = modern;
  for (int l = 0; l < 2; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    for (auto* table : {&modern, &gpt2, &moe}) {
      table->push_back({b + "attn.qkv.weight", {3 * D, D}});
      table->push_back({b + "attn.proj.weight", {D, D}});
    }
    modern.push_back({b + "mlp.fc.weight", {F, D}});
    modern.push_back({b + "mlp.proj.weight", {D, F}});
    for (const char* v :
         {"ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias", "attn.proj.bias", "mlp.proj.bias"})
      gpt2.push_back({b + v, {D}});
    gpt2.push_back({b + "attn.qkv.bias", {3 * D}});
    gpt2.push_back({b + "mlp.fc.bias", {F}});
    gpt2.push_back({b + "mlp.fc.weight", {F, D}});
    gpt2.push_back({b + "mlp.proj.weight", {D, F}});
    moe.push_back({b + "moe.router.weight", {E, D}});
    moe.push_back({b + "moe.fc.weight", {E, F, D}});
    moe.push_back({b + "moe.proj.weight", {E, D, F}});
  }
  for (const auto* table : {&modern, &gpt2, &moe}) {
    OptimizerSet set(config["optim"]["groups"], *table);
    EXPECT_EQ(set.optimizer(set.group_of("blocks.1.attn.qkv.weight")).kind(), std::string("muon"));
    EXPECT_EQ(set.optimizer(set.group_of("embed.weight")).kind(), std::string("adamw"));
  }
  OptimizerSet set(config["optim"]["groups"], moe);
  auto& muon = dynamic_cast<optim::Muon&>(set.optimizer(set.group_of("blocks.0.moe.fc.weight")));
  EXPECT_EQ(muon.view_of("blocks.0.moe.fc.weight", {E, F, D}).at(0).count, E);
  EXPECT_EQ(muon.config().momentum_at(1, 0), 0.85);
  EXPECT_EQ(set.optimizer(set.group_of("blocks.0.moe.router.weight")).kind(), std::string("adamw"));
  auto& embed = dynamic_cast<optim::AdamW&>(set.optimizer(set.group_of("embed.weight")));
  auto& head = dynamic_cast<optim::AdamW&>(set.optimizer(set.group_of("lm_head.weight")));
  EXPECT_DOUBLE_EQ(embed.config().lr * embed.config().lr_mul, 0.6);
  EXPECT_DOUBLE_EQ(head.config().lr * head.config().lr_mul, 0.22);
}

// The record recipe's parameters (model.value_embeds, unet_skips, x0_lambdas) have their groups
// in the preset: the value tables with the embedding, the learned scalars with the vectors; and a
// config whose groups miss one is refused naming it.
TEST(OptimizerSet, PresetCoversTheRecipeParameters) {
  YAML::Node config =
      YAML::LoadFile(std::string(ENGINE_SOURCE_DIR) + "/configs/presets/distadam_muon.yaml");
  const int64_t D = 32, V = 128, F = 128;
  std::vector<ParamDesc> recipe = {{"embed.weight", {V, D}},
                                   {"value_embeds.0.weight", {V, D}},
                                   {"skip_weights", {1}},
                                   {"lm_head.weight", {V, D}}};
  for (int l = 0; l < 2; ++l) {
    const std::string b = "blocks." + std::to_string(l) + ".";
    recipe.push_back({b + "lambdas", {2}});
    recipe.push_back({b + "mlp.fc.weight", {F, D}});
    recipe.push_back({b + "mlp.proj.weight", {D, F}});
  }
  recipe.push_back({"blocks.0.attn.qkv.weight", {3 * D, D}});
  recipe.push_back({"blocks.0.attn.proj.weight", {D, D}});
  recipe.push_back({"blocks.0.attn.v_lambdas", {2}});  // block 1 is MLP only
  OptimizerSet set(config["optim"]["groups"], recipe);
  EXPECT_EQ(set.group_of("value_embeds.0.weight"), set.group_of("embed.weight"));
  const size_t vectors = set.group_of("skip_weights");
  EXPECT_EQ(set.group_of("blocks.1.lambdas"), vectors);
  EXPECT_EQ(set.group_of("blocks.0.attn.v_lambdas"), vectors);
  auto& scalars = dynamic_cast<optim::AdamW&>(set.optimizer(vectors));
  EXPECT_DOUBLE_EQ(scalars.config().lr * scalars.config().lr_mul, 0.04);
  const std::string err = error_of([&] {
    OptimizerSet missing(YAML::Load(R"(
- params: ["blocks.*.mlp.*", "blocks.*.attn.*.weight", "embed.weight", "lm_head.weight"]
  optimizer: adamw
  lr: 0.01
)"),
                         recipe);
  });
  EXPECT_NE(err.find("value_embeds.0.weight"), std::string::npos) << err;
}

namespace {

// embed.weight [64, 16] in an AdamW group stepped every other step; the gradient of step t is
// seeded by t.
struct EveryOtherStep {
  OptimizerSet set{YAML::Load("- {params: ['*'], optimizer: adamw, lr: 0.01, weight_decay: 0.1,"
                              " weight_decay_mode: cautious, update_every: 2}"),
                   std::vector<ParamDesc>{{"embed.weight", {64, 16}}}};
  core::Tensor w = core::Tensor::empty({64, 16});
  EveryOtherStep() { core::fill_normal(w, 1, 0.0f, 0.5f); }
  // Steps t with the gradient seeded by t, times `scale` given as the folded factor (or already
  // applied, folded = false).
  void step(int64_t t, float scale, bool folded) {
    core::Tensor g = core::Tensor::empty({64, 16});
    core::fill_normal(g, 100 + static_cast<uint64_t>(t), 0.0f, 1e-2f);
    if (!folded) core::cpu_backend().scale(g.data<float>(), scale, g.numel());
    const optim::ParamShard shard{"embed.weight", {64, 16}, 0, w, g, 0};
    optim::StepContext ctx = cpu_context();
    ctx.step = t;
    ctx.grad_scale = folded ? &scale : nullptr;
    set.step({&shard, 1}, ctx);
  }
};

}  // namespace

// update_every: 2 leaves the parameter alone on odd steps and steps it on even ones with the
// two gradients summed, each with its own step's folded scale; its accumulator is state.
TEST(OptimizerSet, UpdateEveryStepsOnTheSumOfTheWindowsGradients) {
  EveryOtherStep folded, prescaled;
  const std::vector<float> w0 = folded.w.to_vector();
  folded.step(1, 0.5f, true);
  prescaled.step(1, 0.5f, false);
  EXPECT_EQ(folded.w.to_vector(), w0);  // no update on step 1
  folded.step(2, 2.0f, true);
  prescaled.step(2, 2.0f, false);
  EXPECT_NE(folded.w.to_vector(), w0);
  EXPECT_EQ(folded.w.to_vector(), prescaled.w.to_vector());  // the same bits

  // A resume between steps 3 and 4 carries the accumulated gradient of step 3.
  EveryOtherStep resumed;
  folded.step(3, 1.0f, true);
  optim::OptimizerState state = folded.set.state();
  for (auto& [key, t] : state.tensors)
    t = t.clone();  // the state shares the optimizer's buffers: a checkpoint's copy
  ASSERT_EQ(state.tensors.count("embed.weight/update_every_grad"), 1u);
  resumed.w = folded.w.clone();
  resumed.set.load_state(state);
  folded.step(4, 1.0f, true);
  resumed.step(4, 1.0f, true);
  EXPECT_EQ(resumed.w.to_vector(), folded.w.to_vector());

  // Without it, step 4 is refused, naming the step, the window and the state slot.
  EveryOtherStep fresh;
  const std::string err = error_of([&] { fresh.step(4, 1.0f, true); });
  EXPECT_NE(err.find("optimizer group 0 (update_every 2): step 4 adds to the gradients "
                     "accumulated since step 3, but 'embed.weight' has none of its shape (a "
                     "resume from a state without update_every_grad?)"),
            std::string::npos)
      << err;
  // An accumulator offered to a group that steps every step, and a window under 1.
  OptimizerSet plain(YAML::Load("- {params: ['*'], optimizer: adamw}"),
                     std::vector<ParamDesc>{{"embed.weight", {64, 16}}});
  EXPECT_NE(error_of([&] { plain.load_state(state); })
                .find("optimizer state 'embed.weight/update_every_grad' is update_every's, but "
                      "the group of 'embed.weight' steps every step"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              OptimizerSet bad(YAML::Load("- {params: ['*'], optimizer: adamw, update_every: 0}"),
                               std::vector<ParamDesc>{{"embed.weight", {64, 16}}});
            }).find("'update_every' must be >= 1"),
            std::string::npos);
}
