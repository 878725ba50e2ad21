#include "engine/config.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/check.h"
#include "engine/batch_geometry.h"
#include "tests/test_util.h"

using test_util::error_of;
using namespace std::string_literals;

namespace {

const char* kMinimal = R"(
model:
  n_layer: 2
  d_model: 64
  seq_len: 32
data:
  train: /tmp/x_train_*.bin
  val: /tmp/x_val_*.bin
train:
  batch_tokens: 256
  val_tokens: 64
optim:
  - params: ["*"]
    optimizer: adamw
    lr: 0.001
)";

std::string with(const std::string& extra) {
  return std::string(kMinimal) + extra;
}

TEST(Config, MinimalParsesWithDefaults) {
  engine::Config c = engine::parse_config(kMinimal, "mini.yaml");
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_EQ(c.model.d_model, 64);
  EXPECT_EQ(c.model.n_head, 4);  // default
  EXPECT_EQ(c.model.arch, "modern");
  EXPECT_EQ(c.data.train, "/tmp/x_train_*.bin");
  EXPECT_EQ(c.zero.stage, 1);
  ASSERT_EQ(c.optim.size(), 1u);
  EXPECT_EQ(c.optim[0].optimizer, "adamw");
  EXPECT_EQ(c.optim[0].params, std::vector<std::string>{"*"});
  EXPECT_EQ(c.optim[0].line, 13);
  EXPECT_DOUBLE_EQ(c.optim[0].node["lr"].as<double>(), 0.001);
}

TEST(Config, UnknownKeyNamesKeyFileLineAndSuggestion) {
  std::string msg = error_of([] { engine::parse_config(with("zero:\n  stag: 2\n"), "bad.yaml"); });
  EXPECT_NE(msg.find("bad.yaml:17"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unknown key 'zero.stag'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'zero.stage'"), std::string::npos) << msg;
}

TEST(Config, UnknownSectionAndKeyInWrongSection) {
  std::string msg = error_of([] { engine::parse_config(with("modle: {}\n"), "bad.yaml"); });
  EXPECT_NE(msg.find("unknown key 'modle'"), std::string::npos) << msg;
  msg = error_of([] { engine::parse_config(with("zero:\n  seed: 3\n"), "bad.yaml"); });
  EXPECT_NE(msg.find("did you mean 'train.seed'"), std::string::npos) << msg;
}

TEST(Config, WrongTypeNamesKeyAndLine) {
  std::string msg =
      error_of([] { engine::parse_config("model:\n  n_layer: two\n", "types.yaml"); });
  EXPECT_NE(msg.find("types.yaml:2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'model.n_layer' has the wrong type: expected an integer, got 'two'"),
            std::string::npos)
      << msg;
  msg = error_of([] { engine::parse_config("model:\n  n_layer: 2.5\n", "t.yaml"); });
  EXPECT_NE(msg.find("expected an integer"), std::string::npos) << msg;
  msg = error_of([] { engine::parse_config("data:\n  shuffle: maybe\n", "t.yaml"); });
  EXPECT_NE(msg.find("expected true or false"), std::string::npos) << msg;
  msg = error_of([] { engine::parse_config("model:\n  n_layer: [1, 2]\n", "t.yaml"); });
  EXPECT_NE(msg.find("expected int, got a list"), std::string::npos) << msg;
  msg = error_of([] { engine::parse_config("model: 3\n", "t.yaml"); });
  EXPECT_NE(msg.find("'model' is a section"), std::string::npos) << msg;
}

TEST(Config, MissingRequiredKeys) {
  std::string msg = error_of(
      [] { engine::parse_config("optim:\n  - {params: '*', optimizer: adamw}\n", "req.yaml"); });
  EXPECT_NE(msg.find("req.yaml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing required key 'data.train'"), std::string::npos) << msg;
  msg = error_of([] { engine::parse_config("data: {train: a, val: b}\n", "req.yaml"); });
  EXPECT_NE(msg.find("missing required key 'optim'"), std::string::npos) << msg;
}

// A tool that builds only a model (model_grad) reads only the model section: no data, train or
// optim is required, the train rules do not apply (seq_len 1000 against the default batch_tokens
// 65536 is no multiple), but unknown keys, wrong types and the model's own rules still do.
TEST(Config, ModelOnlyNeedsOnlyTheModelSection) {
  using engine::ConfigUse;
  const std::string model = "model: {n_layer: 1, d_model: 32, n_head: 2, seq_len: 1000}\n";
  const engine::Config c = engine::parse_config(model, "m.yaml", {}, ConfigUse::ModelOnly);
  EXPECT_EQ(c.model.seq_len, 1000);
  EXPECT_TRUE(c.optim.empty());
  std::string msg = error_of([&] { engine::parse_config(model, "m.yaml"); });
  EXPECT_NE(msg.find("missing required key 'data.train'"), std::string::npos) << msg;
  msg = error_of([&] {
    engine::parse_config(model + "data: {train: a, val: b}\n", "m.yaml", {}, ConfigUse::Training);
  });
  EXPECT_NE(msg.find("missing required key 'optim'"), std::string::npos) << msg;
  // A whole engine config reads as a model-only one.
  EXPECT_EQ(engine::parse_config(kMinimal, "x.yaml", {}, ConfigUse::ModelOnly).model.d_model, 64);
  // Names, types and the model's rules are still checked.
  msg = error_of(
      [&] { engine::parse_config(model + "trian: {}\n", "m.yaml", {}, ConfigUse::ModelOnly); });
  EXPECT_NE(msg.find("m.yaml:2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'trian'"), std::string::npos) << msg;
  msg = error_of(
      [&] { engine::parse_config(model, "m.yaml", {"model.n_head=3"}, ConfigUse::ModelOnly); });
  EXPECT_NE(msg.find("'model.d_model'"), std::string::npos) << msg;
  msg = error_of([&] {
    engine::parse_config(model, "m.yaml", {"train.precision=fp16"}, ConfigUse::ModelOnly);
  });
  EXPECT_NE(msg.find("'train.precision': must be fp32, tf32 or bf16"), std::string::npos) << msg;
}

TEST(Config, OptimGroupShape) {
  auto base = std::string("data: {train: a, val: b}\n");
  std::string msg =
      error_of([&] { engine::parse_config(base + "optim:\n  - optimizer: adamw\n", "o.yaml"); });
  EXPECT_NE(msg.find("o.yaml:3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("missing required key 'optim[0].params'"), std::string::npos) << msg;
  msg = error_of([&] { engine::parse_config(base + "optim:\n  - params: ['*']\n", "o.yaml"); });
  EXPECT_NE(msg.find("missing required key 'optim[0].optimizer'"), std::string::npos) << msg;
  msg = error_of([&] { engine::parse_config(base + "optim: {group: []}\n", "o.yaml"); });
  EXPECT_NE(msg.find("unknown key 'optim.group' (did you mean 'optim.groups'?)"), std::string::npos)
      << msg;
  msg = error_of([&] { engine::parse_config(base + "optim: {groups: []}\n", "o.yaml"); });
  EXPECT_NE(msg.find("'optim' must be a non-empty list"), std::string::npos) << msg;
  msg = error_of([&] {
    engine::parse_config(base + "optim:\n  - params: [[1]]\n    optimizer: adamw\n", "o.yaml");
  });
  EXPECT_NE(msg.find("optim[0].params must be a list of name globs"), std::string::npos) << msg;
}

TEST(Config, OptimPresetFileRelativeToConfig) {
  auto dir = std::filesystem::temp_directory_path() / "engine_config_test_preset";
  std::filesystem::create_directories(dir / "presets");
  std::ofstream(dir / "presets" / "p.yaml")
      << "optim:\n  groups:\n  - params: ['*.weight']\n    optimizer: muon\n  - params: ['*']\n"
         "    optimizer: adamw\n";
  std::ofstream(dir / "c.yaml") << "data: {train: a, val: b}\noptim: presets/p.yaml\n";
  engine::Config c = engine::load_config((dir / "c.yaml").string());
  ASSERT_EQ(c.optim.size(), 2u);
  EXPECT_EQ(c.optim[0].optimizer, "muon");
  EXPECT_EQ(c.optim[1].line, 5);
  EXPECT_NE(c.optim[1].file.find("p.yaml"), std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST(Config, FileErrorsNameTheFile) {
  std::string msg = error_of([] { engine::load_config("/nonexistent/x.yaml"); });
  EXPECT_NE(msg.find("/nonexistent/x.yaml: cannot open"), std::string::npos) << msg;
  msg = error_of([] { engine::parse_config("model: [unclosed\n", "syn.yaml"); });
  EXPECT_NE(msg.find("syn.yaml"), std::string::npos) << msg;
  EXPECT_NE(msg.find("YAML syntax error"), std::string::npos) << msg;
}

TEST(Config, ConfigFolderAndOptimScalarAreNamed) {
  auto dir = std::filesystem::temp_directory_path() / "engine_config_test_dir";
  std::filesystem::create_directories(dir);
  std::string msg = error_of([&] { engine::load_config(dir.string()); });
  EXPECT_NE(msg.find(dir.string() + ": is a directory, not a YAML file"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("underflow"), std::string::npos) << msg;
  std::ofstream(dir / "c.yaml") << "data: {train: a, val: b}\noptim: 5\n";
  msg = error_of([&] { engine::load_config((dir / "c.yaml").string()); });
  EXPECT_NE(msg.find("c.yaml:2: 'optim' is '5': expected a list of parameter groups"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("there is no file " + (dir / "5").string()), std::string::npos) << msg;
  msg = error_of([] { engine::parse_config(kMinimal, "o.yaml", {"optim=presets/none.yaml"}); });
  EXPECT_NE(msg.find("'optim' is 'presets/none.yaml'"), std::string::npos) << msg;
  std::filesystem::remove_all(dir);
}

TEST(Config, SizesBeyondTheModelsIntAreRefused) {
  std::string msg =
      error_of([] { engine::parse_config(kMinimal, "s.yaml", {"model.d_model=4294967296"}); });
  EXPECT_NE(msg.find("'model.d_model': is 4294967296, above the largest model size"),
            std::string::npos)
      << msg;
  msg = error_of([] { engine::parse_config(kMinimal, "s.yaml", {"comm.timeout_s=-1"}); });
  EXPECT_NE(msg.find("'comm.timeout_s': must be 0 (no watchdog) or at least 1.0 s, got -1.0"),
            std::string::npos)
      << msg;
}

TEST(Config, OverridesUseTheKeysType) {
  engine::Config c =
      engine::parse_config(kMinimal, "o.yaml",
                           {"train.steps=17", "train.grad_clip=0.5", "data.shuffle=true",
                            "model.arch=gpt2", "model.moe.experts=4"});
  EXPECT_EQ(c.train.steps, 17);
  EXPECT_DOUBLE_EQ(c.train.grad_clip, 0.5);
  EXPECT_TRUE(c.data.shuffle);
  EXPECT_EQ(c.model.arch, "gpt2");
  EXPECT_EQ(c.model.moe_experts, 4);
  // Quotes are YAML's, as in a file: an empty string, a path with a space, a quoted number.
  engine::Config q = engine::parse_config(
      kMinimal, "o.yaml",
      {"model.window=64", "model.window_pattern=\"\"", "log.dir='runs/a b'", "train.steps=\"9\""});
  EXPECT_EQ(q.model.window_pattern, "");
  EXPECT_EQ(q.log.dir, "runs/a b");
  EXPECT_EQ(q.train.steps, 9);
  std::string msg = error_of([] { engine::parse_config(kMinimal, "o.yaml", {"train.steps=x"}); });
  EXPECT_NE(msg.find("--set train.steps=x"), std::string::npos) << msg;
  EXPECT_NE(msg.find("expected an integer"), std::string::npos) << msg;
  // A list value is refused like in a file, not stored as the string "[a.bin, b.bin]" (which
  // a glob would read as a character class).
  msg = error_of([] { engine::parse_config(kMinimal, "o.yaml", {"data.train=[a.bin, b.bin]"}); });
  EXPECT_NE(msg.find("--set data.train=[a.bin, b.bin]: key 'data.train' has the wrong type: "
                     "expected string, got a list"),
            std::string::npos)
      << msg;
  msg = error_of([] { engine::parse_config(kMinimal, "o.yaml", {"train.steps={a: 1}"}); });
  EXPECT_NE(msg.find("expected int, got a map"), std::string::npos) << msg;
  msg = error_of([] { engine::parse_config(kMinimal, "o.yaml", {"train.step=3"}); });
  EXPECT_NE(msg.find("did you mean 'train.steps'"), std::string::npos) << msg;
  msg = error_of([] { engine::parse_config(kMinimal, "o.yaml", {"optim=[{params: ["}); });
  EXPECT_NE(msg.find("--set optim=[{params: [: the value is not valid YAML"), std::string::npos)
      << msg;
  engine::Config o = engine::parse_config(kMinimal, "o.yaml",
                                          {"optim=[{params: ['*'], optimizer: muon, lr: 0.1}]"});
  ASSERT_EQ(o.optim.size(), 1u);
  EXPECT_EQ(o.optim[0].optimizer, "muon");
  msg = error_of([] { engine::parse_config(kMinimal, "o.yaml", {"train.steps"}); });
  EXPECT_NE(msg.find("key=value"), std::string::npos) << msg;
  // A required key may come from an override alone.
  engine::Config d = engine::parse_config("optim: [{params: '*', optimizer: adamw}]\n", "o.yaml",
                                          {"data.train=a", "data.val=b"});
  EXPECT_EQ(d.data.val, "b");
}

// --set optim.<i>.<key>=value: a list index, as Hydra and OmegaConf allow, sets one key of group
// i (from 0); the group is read again, so a new params or optimizer counts; an index beyond the
// groups or a key without one is refused naming the groups there are.
TEST(Config, OverridesIndexTheOptimizerGroups) {
  const std::string two = with(R"(  - params: ["lm_head.weight"]
    optimizer: adamw
    lr: 0.002
    betas: [0.9, 0.95]
)");
  engine::Config c =
      engine::parse_config(two, "o.yaml",
                           {"optim.1.lr=0.01", "optim.1.betas=[0.8, 0.9]", "optim.0.optimizer=muon",
                            "optim.0.params=[blocks.*]", "optim.1.matrix_views.x=3"});
  ASSERT_EQ(c.optim.size(), 2u);
  EXPECT_DOUBLE_EQ(c.optim[1].node["lr"].as<double>(), 0.01);
  EXPECT_EQ(c.optim[1].node["betas"][0].as<double>(), 0.8);
  EXPECT_EQ(c.optim[1].node["matrix_views"]["x"].as<int>(), 3);
  EXPECT_DOUBLE_EQ(c.optim[0].node["lr"].as<double>(), 0.001);
  EXPECT_EQ(c.optim[0].optimizer, "muon");
  EXPECT_EQ(c.optim[0].params, std::vector<std::string>{"blocks.*"});
  EXPECT_EQ(c.optim[1].file, "o.yaml");
  EXPECT_EQ(engine::config_origin(c, "optim.1.lr"), "--set optim.1.lr=0.01");
  std::string msg = error_of([&] { engine::parse_config(two, "o.yaml", {"optim.2.lr=0.1"}); });
  EXPECT_NE(msg.find("--set optim.2.lr=0.1: there is no parameter group 2: optim has 2 "
                     "(optim.0 to optim.1)"),
            std::string::npos)
      << msg;
  msg = error_of([&] { engine::parse_config(two, "o.yaml", {"optim.lr=0.1"}); });
  EXPECT_NE(msg.find("optim.<index>.<key>"), std::string::npos) << msg;
  msg = error_of([&] { engine::parse_config(two, "o.yaml", {"optim.0.optimizer=[a, b]"}); });
  EXPECT_NE(msg.find("optim[0].optimizer must be an optimizer name"), std::string::npos) << msg;
}

TEST(Config, CrossFieldChecksNameTheKey) {
  std::string msg = error_of([] { engine::parse_config(kMinimal, "x.yaml", {"model.n_head=3"}); });
  EXPECT_NE(msg.find("'model.d_model'"), std::string::npos) << msg;
  msg = error_of([] { engine::parse_config(kMinimal, "x.yaml", {"zero.stage=4"}); });
  EXPECT_NE(msg.find("'zero.stage': must be 1, 2 or 3"), std::string::npos) << msg;
  msg = error_of([] { engine::parse_config(kMinimal, "x.yaml", {"train.batch_tokens=100"}); });
  EXPECT_NE(msg.find("'train.batch_tokens'"), std::string::npos) << msg;
  msg = error_of([] { engine::parse_config(kMinimal, "x.yaml", {"train.lr_schedule=step"}); });
  EXPECT_NE(msg.find("'train.lr_schedule'"), std::string::npos) << msg;
  msg = error_of([] { engine::parse_config(kMinimal, "x.yaml", {"model.arch=llama"}); });
  EXPECT_NE(msg.find("'model.arch'"), std::string::npos) << msg;
  msg = error_of([] { engine::parse_config(kMinimal, "x.yaml", {"train.precision=fp16"}); });
  EXPECT_NE(msg.find("'train.precision': must be fp32, tf32 or bf16, got 'fp16'"),
            std::string::npos)
      << msg;
}

// The record recipe's model keys (docs/specs/modded_nanogpt.md c.1): each bad value is refused
// naming its key.
TEST(Config, RecipeKeysAreCheckedByName) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"model.vocab_pad=0"}, "'model.vocab_pad': must be in [1, 4096]"},
      {{"model.softcap_form=cosine"}, "'model.softcap_form': must be tanh or sigmoid"},
      {{"model.softcap_form=sigmoid", "model.softcap_scale=10"},
       "'model.softcap': must be positive"},
      {{"model.softcap_form=sigmoid", "model.softcap=30"},
       "'model.softcap_scale': must be positive"},
      {{"model.softcap_offset=5"}, "'model.softcap_offset': needs model.softcap_form sigmoid"},
      {{"model.softcap_form=sigmoid", "model.softcap=23", "model.softcap_scale=7.5",
        "model.softcap_offset=5", "train.precision=bf16"},
       "'model.softcap_offset': needs f32 logits"},
      {{"model.attn_scale=-1"}, "'model.attn_scale': must be >= 0"},
      {{"model.no_attn_layers=1;2"}, "'model.no_attn_layers': must be a comma list"},
      {{"model.no_attn_layers=-1"}, "'model.no_attn_layers': must be a comma list"},
      {{"model.no_attn_layers=0, 2"}, "'model.no_attn_layers': block 2 is outside"},
      {{"model.value_embeds=2"}, "'model.value_embeds': must be in [0, model.n_layer / 2]"},
      {{"model.arch=gpt2", "model.unet_skips=true"}, "'model.unet_skips': needs model.arch modern"},
      {{"model.arch=gpt2", "model.x0_lambdas=true"}, "'model.x0_lambdas': needs model.arch modern"},
      {{"model.arch=gpt2", "model.value_embeds=1"},
       "'model.value_embeds': needs model.arch modern"},
      {{"model.arch=gpt2", "model.attn_scale=0.12"}, "'model.attn_scale': needs model.arch modern"},
      {{"model.arch=gpt2", "model.no_attn_layers=1"},
       "'model.no_attn_layers': needs model.arch modern"},
      {{"model.arch=gpt2", "model.zero_init_head=true"},
       "'model.zero_init_head': needs model.arch modern"},
      {{"model.doc_bos=50257"}, "'model.doc_bos': must be -1 (off) or a token id"},
      {{"model.doc_bos=-2"}, "'model.doc_bos': must be -1 (off) or a token id"},
      {{"model.window=-1"}, "'model.window': must be >= 0"},
      {{"model.window_pattern=LS"}, "'model.window_pattern': needs model.window"},
      {{"model.window=64", "model.window_pattern=LSL"}, "'model.window_pattern': must be one L"},
      {{"model.window=64", "model.window_pattern=LX"}, "'model.window_pattern': must be one L"},
      {{"model.window_grow=true"}, "'model.window_grow': needs model.window"},
      {{"model.arch=gpt2", "model.doc_bos=0"}, "'model.doc_bos': needs model.arch modern"},
      {{"model.arch=gpt2", "model.window=64"}, "'model.window': needs model.arch modern"},
      {{"model.arch=gpt2", "model.softcap_form=sigmoid", "model.softcap=30",
        "model.softcap_scale=5"},
       "'model.softcap_form': needs model.arch modern"},
      // The record's exact forms (docs/record_recipe.md).
      {{"model.arch=gpt2", "model.x0_norm=true"}, "'model.x0_norm': needs model.arch modern"},
      {{"model.arch=gpt2", "model.head_fp8=true"}, "'model.head_fp8': needs model.arch modern"},
      {{"model.arch=gpt2", "model.mlp_fp8=true"}, "'model.mlp_fp8': needs model.arch modern"},
      {{"model.mlp_fp8=true", "model.moe.experts=4", "model.moe.top_k=2"},
       "'model.mlp_fp8': runs the dense MLP's GEMMs in FP8"},
      {{"model.key_offset=true", "model.window=64"}, "'model.key_offset': shifts the keys'"},
      {{"model.key_offset=true", "model.rotary_truncate=true"},
       "'model.key_offset': shifts the keys'"},
      {{"model.arch=gpt2", "model.bigram_rows=97"}, "'model.bigram_rows': needs model.arch modern"},
      {{"model.bigram_rows=1"}, "'model.bigram_rows': must be 0 (off) or in [2, 2^31]"},
      {{"model.arch=gpt2", "model.smear=true"}, "'model.smear': needs model.arch modern"},
      {{"model.smear=true"}, "'model.smear': smears the embedding rows before x0's norm"},
      {{"model.arch=gpt2", "model.rotary_truncate=true"},
       "'model.rotary_truncate': needs model.arch modern"},
      {{"model.arch=gpt2", "model.sublayer_lambdas=true"},
       "'model.sublayer_lambdas': needs model.arch modern"},
      {{"model.arch=gpt2", "model.qkvo_lambdas=true"},
       "'model.qkvo_lambdas': needs model.arch modern"},
      {{"model.value_embed_layers=1, x"}, "'model.value_embed_layers': must be a comma list"},
      {{"model.value_embed_layers=1", "model.value_embeds=2"},
       "'model.value_embed_layers': places one table per named block"},
      {{"model.value_embed_layers=0, 0"}, "'model.value_embed_layers': block 0 must be an"},
      {{"model.n_layer=4", "model.value_embed_layers=4"},
       "'model.value_embed_layers': block 4 must be an"},
      {{"model.arch=gpt2", "model.value_embed_layers=1"},
       "'model.value_embed_layers': needs model.arch modern"},
      {{"model.mudd=true"}, "'model.mudd': wires record #89's 11 blocks of 6 heads"},
      {{"model.arch=gpt2", "model.mudd=true"}, "'model.mudd': needs model.arch modern"},
      {{"model.sublayer_lambdas=true", "model.moe.experts=2"},
       "'model.sublayer_lambdas': mixes a dense MLP's output alone"},
      // Record #89's attention keys.
      {{"model.paired_head_layers=0;1"}, "'model.paired_head_layers': must be a comma list"},
      {{"model.paired_head_layers=5"},
       "'model.paired_head_layers': block 5 is not an attention block"},
      {{"model.xsa_layers=0", "model.paired_head_layers=0"},
       "'model.xsa_layers': block 0 has paired heads"},
      {{"model.attn_gate_layers=0", "model.no_attn_layers=0"},
       "'model.attn_gate_layers': block 0 is not an attention block"},
      {{"model.arch=gpt2", "model.xsa_layers=0"}, "'model.xsa_layers': needs model.arch modern"},
      {{"model.yarn=true", "model.window=64"}, "'model.yarn': rescales at each change"},
      {{"model.norm_eps=0"}, "'model.norm_eps': must be positive"},
      {{"model.rotary_base=1"}, "'model.rotary_base': must be above 1"},
      {{"model.embed_std=0"}, "'model.embed_std': must be positive"},
      {{"model.norm_eps=1e308"}, "'model.norm_eps': must be below 1"},
      {{"model.embed_std=1e30"}, "'model.embed_std': must be at most 10"},
      {{"model.window_block=-1"}, "'model.window_block': must be >= 0"},
      {{"model.window_block=128"}, "'model.window_block': needs model.window, a multiple of it"},
      {{"model.window=100", "model.window_block=128"},
       "'model.window_block': needs model.window, a multiple of it"},
      {{"model.n_head=16", "model.rotary_truncate=true"},
       "'model.rotary_truncate': needs a head size that is a multiple of 4 and at least 8"},
  };
  for (const auto& [sets, want] : cases) {
    const std::string msg = error_of([&] { engine::parse_config(kMinimal, "x.yaml", sets); });
    EXPECT_NE(msg.find(want), std::string::npos) << sets.front() << ": " << msg;
  }
  // The good forms parse: every key on.
  const engine::Config c = engine::parse_config(kMinimal, "x.yaml",
                                                {"model.vocab_pad=128",
                                                 "model.softcap_form=sigmoid",
                                                 "model.softcap=30",
                                                 "model.softcap_scale=60",
                                                 "model.attn_scale=0.12",
                                                 "model.no_attn_layers= 1 ,0",
                                                 "model.value_embeds=1",
                                                 "model.unet_skips=true",
                                                 "model.x0_lambdas=true",
                                                 "model.zero_init_head=true",
                                                 "model.doc_bos=50256",
                                                 "model.window=64",
                                                 "model.window_pattern=LS",
                                                 "model.window_grow=true",
                                                 "model.window_block=32",
                                                 "model.x0_norm=true",
                                                 "model.norm_eps=1.1920928955078125e-07",
                                                 "model.rotary_base=1024",
                                                 "model.rotary_truncate=true",
                                                 "model.v_lambdas_all=true",
                                                 "model.loss_over_padding=true",
                                                 "model.embed_std=1",
                                                 "model.uniform_matrix_init=true",
                                                 "model.head_fp8=true"});
  EXPECT_EQ(engine::parse_block_list(c.model.no_attn_layers), (std::vector<int>{1, 0}));
  EXPECT_EQ(engine::parse_block_list(""), std::vector<int>{});
}

// A range error names where the value came from: the --set argument that gave it (it used to
// name the YAML file), else the file and line, else the file (a default).
TEST(Config, RangeErrorsNameWhereTheValueWasSet) {
  std::string msg = error_of([] { engine::parse_config(kMinimal, "x.yaml", {"zero.stage=4"}); });
  EXPECT_NE(msg.find("config error: --set zero.stage=4: key 'zero.stage'"), std::string::npos)
      << msg;
  msg = error_of([] { engine::parse_config(with("train:\n  lr_floor: 2\n"), "x.yaml"); });
  EXPECT_NE(msg.find("config error: x.yaml:17: key 'train.lr_floor': must be in [0, 1]"),
            std::string::npos)
      << msg;
  // The last setting wins, and is the one named.
  msg =
      error_of([] { engine::parse_config(with("log:\n  every: 3\n"), "x.yaml", {"log.every=0"}); });
  EXPECT_NE(msg.find("--set log.every=0: key 'log.every'"), std::string::npos) << msg;
  const engine::Config c = engine::parse_config(kMinimal, "x.yaml", {"train.steps=7"});
  EXPECT_EQ(engine::config_origin(c, "train.steps"), "--set train.steps=7");
  EXPECT_EQ(engine::config_origin(c, "model.d_model"), "x.yaml:4");
  EXPECT_EQ(engine::config_origin(c, "zero.stage"), "x.yaml");
}

// Values that mean nothing are refused with the key; 0 keeps its meaning (off, the table).
TEST(Config, NegativeTargetLossAndPeakAreRefused) {
  std::string msg =
      error_of([] { engine::parse_config(kMinimal, "x.yaml", {"train.target_val_loss=-1"}); });
  EXPECT_NE(msg.find("key 'train.target_val_loss': must be >= 0"), std::string::npos) << msg;
  msg = error_of([] { engine::parse_config(kMinimal, "x.yaml", {"log.peak_gflops=-5"}); });
  EXPECT_NE(msg.find("key 'log.peak_gflops': must be >= 0"), std::string::npos) << msg;
  EXPECT_NO_THROW(
      engine::parse_config(kMinimal, "x.yaml", {"train.target_val_loss=0", "log.peak_gflops=0"}));
}

// log.trace: a step range FIRST-LAST or one step, from 1; anything else names the key.
TEST(Config, TraceStepsAreARange) {
  EXPECT_EQ(engine::parse_step_range("3-5"), std::make_pair(int64_t{3}, int64_t{5}));
  EXPECT_EQ(engine::parse_step_range("7"), std::make_pair(int64_t{7}, int64_t{7}));
  for (const char* bad : {"", "0-2", "5-3", "2-", "-2", "a-b", "2-3-4", "1.5", " 2"})
    EXPECT_FALSE(engine::parse_step_range(bad)) << bad;
  EXPECT_EQ(engine::parse_config(kMinimal, "x.yaml", {"log.trace=2-3"}).log.trace, "2-3");
  const std::string msg =
      error_of([] { engine::parse_config(kMinimal, "x.yaml", {"log.trace=3-2"}); });
  EXPECT_NE(msg.find("key 'log.trace': must be FIRST-LAST or STEP"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'3-2'"), std::string::npos) << msg;
  const engine::Config late =
      engine::parse_config(kMinimal, "x.yaml", {"train.steps=10", "log.trace=11-12"});
  const std::vector<std::string> warnings = engine::config_warnings(late);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("key 'log.trace' = 11-12 starts after train.steps = 10"),
            std::string::npos)
      << warnings[0];
  EXPECT_TRUE(engine::config_warnings(
                  engine::parse_config(kMinimal, "x.yaml", {"train.steps=10", "log.trace=10"}))
                  .empty());
}

// yaml-cpp's Load reads the first document only: the keys after a `---` were dropped silently.
TEST(Config, SecondYamlDocumentIsRefused) {
  std::string msg =
      error_of([] { engine::parse_config(with("---\ntrain:\n  steps: 5\n"), "two.yaml"); });
  EXPECT_NE(msg.find("two.yaml:17: a second YAML document"), std::string::npos) << msg;
  const std::string path = testing::TempDir() + "two_docs.yaml";
  std::ofstream(path) << with("---\ntrain:\n  steps: 5\n");
  msg = error_of([&] { engine::load_config(path); });
  EXPECT_NE(msg.find(path + ":17: a second YAML document"), std::string::npos) << msg;
  // A leading `---` and an end marker `...` are one document.
  EXPECT_NO_THROW(engine::parse_config("---\n" + std::string(kMinimal) + "...\n", "one.yaml"));
}

// yaml-cpp's LoadAll never returned on a stray ',' before any content (an empty document at the
// same place, forever, until memory ran out; found by the config fuzzer): a syntax error with its
// line, from a string and from a file.
TEST(Config, StrayFlowIndicatorIsASyntaxErrorNotAnEndlessLoop) {
  std::string msg = error_of([] { engine::parse_config(", lr: 0.}\n", "stray.yaml"); });
  EXPECT_NE(msg.find("stray.yaml:1:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("YAML syntax error"), std::string::npos) << msg;
  const std::string path = testing::TempDir() + "stray_comma.yaml";
  std::ofstream(path) << ", a: 1\n";
  msg = error_of([&] { engine::load_config(path); });
  EXPECT_NE(msg.find(path + ":1:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("YAML syntax error"), std::string::npos) << msg;
}

// Hostile configs, each refused in one readable line naming where: the text is bounded (size,
// nodes once aliases expand, nesting) and must be text; user input echoed in a message is cut.
TEST(Config, HostileConfigsAreRefusedInOneLine) {
  // Nine levels of ten aliases each: 10^9 nodes once expanded (yaml-cpp shares them; a walk over
  // the tree, a clone or the printed config would not).
  std::string bomb =
      "optim:\n  - params: ['*']\n    optimizer: adamw\n    l0: &a0 [x, x, x, x, x, "
      "x, x, x, x, x]\n";
  for (int level = 1; level < 9; ++level) {
    bomb += "    l" + std::to_string(level) + ": &a" + std::to_string(level) + " [";
    for (int i = 0; i < 10; ++i)
      bomb += std::string(i ? ", " : "") + "*a" + std::to_string(level - 1);
    bomb += "]\n";
  }
  std::string flow_bomb =
      "{params: ['*'], optimizer: adamw, l0: &a0 [x, x, x, x, x, x, x, x, x, x]";
  for (int level = 1; level < 9; ++level) {
    flow_bomb += ", l" + std::to_string(level) + ": &a" + std::to_string(level) + " [";
    for (int i = 0; i < 10; ++i)
      flow_bomb += std::string(i ? ", " : "") + "*a" + std::to_string(level - 1);
    flow_bomb += "]";
  }
  flow_bomb += "}";
  const std::string deep = "model: " + std::string(10000, '[') + std::string(10000, ']') + "\n";
  const std::string long_value(200'000, '7');
  struct Case {
    const char* what;
    std::string text;
    std::vector<std::string> overrides;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"alias bomb", bomb, {}, "h.yaml:8: the document expands to more than 100000 nodes"},
      {"alias bomb in --set optim",
       "data: {train: a, val: b}\n",
       {"optim=[" + flow_bomb + "]"},
       "bytes):1: the document expands to more than 100000 nodes"},
      {"deep nesting", deep, {}, "h.yaml:1: nested more than 64 levels deep: a config is small"},
      {"enormous file",
       with("# " + std::string(2 << 20, 'x') + "\n"),
       {},
       "bytes, more than a config's 1048576: a config is small"},
      {"NUL byte in a quoted value",
       with("log:\n  dir: \"run\0/../etc\"\n"s),
       {},
       "h.yaml:17: a NUL byte (at byte"},
      {"invalid UTF-8", with("log:\n  dir: \"r\xff\xfeun\"\n"), {}, "h.yaml:17: invalid UTF-8"},
      {"duplicate key",
       with("train:\n  batch_tokens: 5\n"),
       {},
       "h.yaml:17: key 'train.batch_tokens' is given twice"},
      {"duplicate optim",
       with("optim: [{params: ['*'], optimizer: muon}]\n"),
       {},
       "h.yaml:16: key 'optim' is given twice"},
      {"--set NaN", kMinimal, {"train.grad_clip=nan"}, "expected a finite number, got 'nan'"},
      {"--set inf", kMinimal, {"train.grad_clip=-inf"}, "expected a finite number, got '-inf'"},
      {"--set 1e999", kMinimal, {"train.grad_clip=1e999"}, "expected a finite number"},
      {"--set 1e308 as an int",
       kMinimal,
       {"train.steps=1e308"},
       "expected an integer, got '1e308'"},
      {"--set overlong value",
       kMinimal,
       {"train.steps=" + long_value},
       "--set train.steps=" + long_value.substr(0, 68) +
           "... (200012 bytes): key 'train.steps' "
           "has the wrong type: expected an integer, got '" +
           long_value.substr(0, 80) + "... (200000 bytes)'"},
      {"--set overlong key", kMinimal, {long_value + "=1"}, "... (200002 bytes): unknown key '"},
  };
  for (const Case& c : cases) {
    const std::string msg = error_of([&] { engine::parse_config(c.text, "h.yaml", c.overrides); });
    EXPECT_NE(msg.find(c.expected), std::string::npos) << c.what << ": " << msg.substr(0, 500);
    EXPECT_EQ(msg.find('\n'), std::string::npos) << c.what << ": more than one line";
    EXPECT_LT(msg.size(), 400u) << c.what << ": " << msg.substr(0, 500);
  }
  // The file itself: read no further than one byte past the limit (a device never ends).
  const std::string msg = error_of([] { engine::load_config("/dev/zero"); });
  EXPECT_NE(msg.find("/dev/zero: is more than 1048576 bytes: a config is small"), std::string::npos)
      << msg.substr(0, 500);
}

// A value echoed in a choice error was printed whole (a 100,000-character value gave a
// 100,168-character line).
TEST(Config, EchoedValuesAreCutToABoundedLength) {
  const std::string value(100000, 'x');
  for (const std::string key : {"model.arch", "device", "train.lr_schedule", "zero.progress"}) {
    const std::string msg =
        error_of([&] { engine::parse_config(kMinimal, "m.yaml", {key + "=" + value}); });
    EXPECT_LT(msg.size(), 400u) << key << ": " << msg.substr(0, 300);
    EXPECT_NE(msg.find("... (100000 bytes)"), std::string::npos)
        << key << ": " << msg.substr(0, 300);
  }
}

TEST(Config, LookAlikeLettersInKeysArePointedOut) {
  // "n_heаd" with a Cyrillic 'а' (U+0430), in a file and in a --set.
  const std::string key =
      "n_he\xD0\xB0"
      "d";
  std::string msg = error_of([&] {
    engine::parse_config(std::string(kMinimal).replace(std::string(kMinimal).find("  n_layer"), 0,
                                                       "  " + key + ": 4\n"),
                         "u.yaml");
  });
  EXPECT_NE(msg.find("unknown key 'model.n_he\\u{430}d' (did you mean 'model.n_head'?); it holds "
                     "\\u{430}, no printable ASCII character: config keys are ASCII"),
            std::string::npos)
      << msg;
  msg = error_of([&] { engine::parse_config(kMinimal, "u.yaml", {"model." + key + "=4"}); });
  EXPECT_NE(msg.find("--set model." + key +
                     "=4: unknown key 'model.n_he\\u{430}d' (did you mean "
                     "'model.n_head'?); it holds \\u{430}"),
            std::string::npos)
      << msg;
  // An ASCII typo has no such note.
  msg = error_of([&] { engine::parse_config(kMinimal, "u.yaml", {"model.n_heda=4"}); });
  EXPECT_EQ(msg.find("it holds"), std::string::npos) << msg;
}

TEST(Config, KeyGivenTwiceInOneOptimizerGroupIsRefused) {
  const std::string text = std::string(kMinimal) + "    lr: 0.5\n";
  const std::string msg = error_of([&] { engine::parse_config(text, "g.yaml"); });
  EXPECT_NE(msg.find("config error: g.yaml:16: optim[0]: key 'lr' is given twice"),
            std::string::npos)
      << msg;
}

// A group key that cannot be a hyperparameter's name (control characters, punctuation, over 64
// characters) is refused at its line. Found by the config fuzzer: a key of control characters
// 600 bytes long passed, and the effective config written from it was not valid YAML (an escaped
// plain key past 1024 characters), so the run's effective.yaml could not be read back.
TEST(Config, OptimizerGroupKeyThatIsNoNameIsRefused) {
  const std::string control = "momentum" + std::string(300, '\x01') + std::string(300, '\x7f');
  for (const std::string& key : {control, std::string("beta-1"), std::string(65, 'b')}) {
    const std::string text = std::string(kMinimal) + "    " + key + ": 0.5\n";
    const std::string msg = error_of([&] { engine::parse_config(text, "k.yaml"); });
    EXPECT_NE(msg.find("config error: k.yaml:16: optim[0]: key '"), std::string::npos) << msg;
    EXPECT_NE(msg.find("' is not a hyperparameter name (letters, digits and '_', at most 64)"),
              std::string::npos)
        << msg;
  }
  // A name of 64 characters is the optimizer's to judge, not the parser's.
  const std::string text = std::string(kMinimal) + "    " + std::string(64, 'b') + ": 0.5\n";
  EXPECT_NO_THROW(engine::parse_config(text, "k.yaml"));
}

TEST(Config, YamlMergeKeysAreRefusedByName) {
  const std::string merged = std::string(kMinimal).substr(0, std::string(kMinimal).find("optim:")) +
                             "optim:\n  - &adam {params: ['*.weight'], optimizer: adamw, lr: 0.1}\n"
                             "  - <<: *adam\n    params: ['*']\n";
  std::string msg = error_of([&] { engine::parse_config(merged, "y.yaml"); });
  EXPECT_NE(msg.find("config error: y.yaml:14: YAML merge keys ('<<: *name') are not supported"),
            std::string::npos)
      << msg;
  msg = error_of([&] { engine::parse_config(with("log:\n  <<: {every: 2}\n"), "y.yaml"); });
  EXPECT_NE(msg.find("YAML merge keys ('<<: *name') are not supported"), std::string::npos) << msg;
}

TEST(Config, SetOfAGroupsParamsNamesTheSet) {
  const std::string msg =
      error_of([&] { engine::parse_config(kMinimal, "p.yaml", {"optim.0.params=[]"}); });
  EXPECT_NE(msg.find("config error: --set optim.0.params=[]: optim[0].params must be a glob or a "
                     "non-empty list of globs"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("p.yaml"), std::string::npos) << msg;
}

TEST(Config, CommTimeoutBelowASecondIsRefused) {
  std::string msg =
      error_of([&] { engine::parse_config(kMinimal, "t.yaml", {"comm.timeout_s=0.01"}); });
  EXPECT_NE(msg.find("key 'comm.timeout_s': must be 0 (no watchdog) or at least 1.0 s, got 0.01"),
            std::string::npos)
      << msg;
  EXPECT_NO_THROW(engine::parse_config(kMinimal, "t.yaml", {"comm.timeout_s=0"}));
  EXPECT_NO_THROW(engine::parse_config(kMinimal, "t.yaml", {"comm.timeout_s=1"}));
}

// --set values are finite where the key is a float; 1e308 is a number and is checked like any
// other by the key's own range.
TEST(Config, LargeButFiniteSetValuesMeetTheKeysRange) {
  const std::string msg =
      error_of([] { engine::parse_config(kMinimal, "x.yaml", {"train.lr_floor=1e308"}); });
  EXPECT_NE(msg.find("--set train.lr_floor=1e308: key 'train.lr_floor': must be in [0, 1]"),
            std::string::npos)
      << msg;
}

// The batch-geometry checks name where their key was set: a --set value was blamed on the file.
TEST(BatchGeometry, RefusalsNameWhereTheKeyWasSet) {
  const engine::Config from_set =
      engine::parse_config(kMinimal, "g.yaml", {"train.batch_tokens=96", "train.val_tokens=96"});
  std::string msg = error_of([&] { engine::BatchGeometry::of(from_set, 4); });
  EXPECT_NE(msg.find("config error: --set train.batch_tokens=96: key 'train.batch_tokens' = 96 "
                     "gives 3 sequences per step, not divisible by the world size 4"),
            std::string::npos)
      << msg;
  const engine::Config from_file = engine::parse_config(kMinimal, "g.yaml");
  msg = error_of([&] { engine::BatchGeometry::of(from_file, 3); });
  EXPECT_NE(msg.find("config error: g.yaml:10: key 'train.batch_tokens' = 256"), std::string::npos)
      << msg;
  const engine::Config val_from_set =
      engine::parse_config(kMinimal, "g.yaml", {"train.val_tokens=96"});
  msg = error_of([&] { engine::BatchGeometry::of(val_from_set, 2); });
  EXPECT_NE(msg.find("config error: --set train.val_tokens=96: key 'train.val_tokens' = 96"),
            std::string::npos)
      << msg;
}

// A warmup longer than the run is allowed (a short trial of a long run's config) but warned
// about, naming the key and where it was set.
TEST(Config, WarmupBeyondTheRunIsWarned) {
  const engine::Config ok =
      engine::parse_config(kMinimal, "x.yaml", {"train.steps=10", "train.lr_warmup_steps=10"});
  EXPECT_TRUE(engine::config_warnings(ok).empty());
  const engine::Config c =
      engine::parse_config(kMinimal, "x.yaml", {"train.steps=10", "train.lr_warmup_steps=1000"});
  const std::vector<std::string> w = engine::config_warnings(c);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_NE(w[0].find("--set train.lr_warmup_steps=1000: key 'train.lr_warmup_steps' = 1000 is "
                      "beyond train.steps = 10"),
            std::string::npos)
      << w[0];
  EXPECT_NE(w[0].find("takes 0.01 of it"), std::string::npos) << w[0];
}

TEST(Config, EffectiveYamlRoundTrips) {
  engine::Config c = engine::parse_config(
      kMinimal, "rt.yaml", {"train.grad_clip=0.1", "model.softcap=15", "checkpoint.resume=auto"});
  std::string text = engine::config_to_yaml(c);
  engine::Config back = engine::parse_config(text, "effective.yaml");
  EXPECT_EQ(engine::config_to_yaml(back), text);
  EXPECT_DOUBLE_EQ(back.train.grad_clip, 0.1);
  EXPECT_EQ(back.checkpoint.resume, "auto");
  EXPECT_NE(text.find("moe:"), std::string::npos) << text;
  ASSERT_EQ(back.optim.size(), 1u);
  EXPECT_DOUBLE_EQ(back.optim[0].node["lr"].as<double>(), 0.001);
}

// Locks the key list: adding or renaming a key must update this test and the table of
// docs/configuration.md.
TEST(Config, KeyListIsLocked) {
  std::string keys;
  for (const auto& f : engine::config_fields())
    keys += f.key + " ";
  EXPECT_EQ(
      keys,
      "device model.arch model.n_layer model.n_head model.d_model model.seq_len model.vocab_size "
      "model.softcap model.moe.experts model.moe.top_k model.moe.aux_weight model.vocab_pad "
      "model.softcap_form model.softcap_scale model.softcap_offset model.attn_scale "
      "model.no_attn_layers "
      "model.value_embeds model.value_embed_layers model.unet_skips model.x0_lambdas "
      "model.zero_init_head model.doc_bos "
      "model.window model.window_pattern model.window_grow model.window_block model.x0_norm "
      "model.norm_eps model.rotary_base model.rotary_truncate model.v_lambdas_all "
      "model.loss_over_padding model.embed_std model.uniform_matrix_init model.head_fp8 "
      "model.mlp_fp8 model.head_fp8_x_scale model.head_fp8_w_scale model.head_fp8_grad_scale "
      "model.key_offset model.bigram_rows model.smear model.sublayer_lambdas model.qkvo_lambdas "
      "model.mudd model.paired_head_layers model.yarn model.xsa_layers model.attn_gate_layers "
      "data.train "
      "data.val data.shuffle data.shard_whole_batches data.bos train.seed train.steps "
      "train.batch_tokens train.micro_batch "
      "train.grad_clip train.precision train.lr_schedule train.lr_warmup_steps "
      "train.lr_cooldown_frac "
      "train.lr_floor train.lr_at_step_start train.rank_sum_loss train.eval_every train.val_tokens "
      "train.target_val_loss "
      "train.diverge_loss_factor train.diverge_zero_grad_steps train.warmup_steps train.init_from "
      "train.stages.batch_tokens train.stages.durations train.stages.extension_steps "
      "train.stages.rows train.stages.max_doc_tokens train.stages.max_docs train.stages.windows "
      "train.stages.lr_mul train.stages.mtp train.stages.final_window train.stages.prefix "
      "train.stages.prefix_vocab "
      "zero.stage zero.overlap zero.bucket_mb "
      "zero.progress zero.sparse_rows checkpoint.dir checkpoint.every checkpoint.at_end "
      "checkpoint.keep checkpoint.keep_best checkpoint.resume checkpoint.overwrite "
      "checkpoint.on_signal "
      "comm.timeout_s comm.device_collectives log.dir log.every log.metrics log.peak_gflops "
      "log.device_timing log.trace log.tensorboard ");
}

// The top-level `device` key: from YAML and --set, refused outside its choices, and printed as a
// top-level scalar that parses back.
TEST(Config, DeviceKeyIsTopLevel) {
  EXPECT_EQ(engine::Config().device, "auto");
  const std::string yaml =
      "device: cpu\ndata: {train: a, val: b}\noptim: [{params: ['*'], optimizer: adamw}]\n";
  engine::Config c = engine::parse_config(yaml, "t.yaml");
  EXPECT_EQ(c.device, "cpu");
  c = engine::parse_config(yaml, "t.yaml", {"device=cuda"});
  EXPECT_EQ(c.device, "cuda");
  const std::string text = engine::config_to_yaml(c);
  EXPECT_EQ(text.rfind("device: cuda\n", 0), 0u) << text;
  EXPECT_EQ(engine::parse_config(text, "back.yaml").device, "cuda");
  try {
    engine::parse_config(yaml, "t.yaml", {"device=gpu"});
    ADD_FAILURE() << "device=gpu was accepted";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("key 'device': must be auto, cpu or cuda, got 'gpu'"),
              std::string::npos)
        << e.what();
  }
}

TEST(Config, ReferenceTableListsEveryKey) {
  std::string table = engine::config_reference_markdown();
  for (const auto& f : engine::config_fields())
    EXPECT_NE(table.find("`" + f.key + "`"), std::string::npos) << f.key;
  EXPECT_NE(table.find("| `train.steps` | int | `1000` |"), std::string::npos) << table;
  EXPECT_NE(table.find("| `data.train` | string | (required) |"), std::string::npos) << table;
}

}  // namespace
