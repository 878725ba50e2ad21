// PyTorch parity (llm.c's way of keeping the C honest): random weights and tokens are written
// to files, apps/model_grad and scripts/torch_reference.py (float64) each compute the loss and
// every gradient, and the two must agree: loss relative error <= 2e-7 (measured 0: both round
// to the same float), each gradient ||engine - torch|| / ||torch|| <= 5e-6 (measured 5.7e-7 ..
// 7.8e-7 over the four cases). Both checks fail on a NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/compare.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "data/token_shard.h"
#include "model/gpt.h"
#include "model/weights_io.h"

namespace {

struct Case {
  std::string name;
  model::ModelConfig config;
  std::string yaml;
};

model::ModelConfig base(model::Arch arch) {
  model::ModelConfig c;
  c.arch = arch;
  c.n_layer = 2;
  c.n_head = 4;
  c.d_model = 32;
  c.seq_len = 16;
  c.vocab_size = 200;  // padded to 256
  return c;
}

// An engine config whose model section is `c` (data and optim are required keys the model does
// not read).
std::string yaml_of(const model::ModelConfig& c) {
  std::string y =
      "model:\n  arch: " + std::string(model::arch_name(c.arch)) +
      "\n  n_layer: " + std::to_string(c.n_layer) + "\n  n_head: " + std::to_string(c.n_head) +
      "\n  d_model: " + std::to_string(c.d_model) + "\n  seq_len: " + std::to_string(c.seq_len) +
      "\n  vocab_size: " + std::to_string(c.vocab_size) +
      "\n  softcap: " + std::to_string(c.softcap) + "\n";
  if (c.moe()) {
    y += "  moe:\n    experts: " + std::to_string(c.moe_experts) +
         "\n    top_k: " + std::to_string(c.moe_top_k) +
         "\n    aux_weight: " + std::to_string(c.moe_aux_weight) + "\n";
  }
  y += "data: {train: unused, val: unused}\ntrain: {batch_tokens: " + std::to_string(c.seq_len) +
       ", val_tokens: " + std::to_string(c.seq_len) +
       "}\noptim: [{params: ['*'], optimizer: adamw}]\n";
  return y;
}

// Weights drawn wider than the init (and non-zero projections, non-unit norms) so that every
// path of the backward carries signal; padded vocabulary rows are random too: they must not
// matter.
void randomise(model::Gpt& gpt, uint64_t seed) {
  for (size_t i = 0; i < gpt.table().size(); ++i) {
    const auto& p = gpt.table()[i];
    core::Tensor t = gpt.param(i);
    core::fill_normal(t, core::rng_hash(seed, i), 0.0f, 0.15f);
    if (p.init == model::InitRule::One) {
      auto* d = t.data<float>();
      for (int64_t e = 0; e < p.numel; ++e)
        d[e] += 1.0f;
    }
  }
}

void run_case(const std::string& name, const model::ModelConfig& config, int batch) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(TEST_WORK_DIR) / ("parity_" + name);
  fs::create_directories(dir);
  const std::string yaml = (dir / "model.yaml").string(),
                    weights = (dir / "w.safetensors").string(),
                    tokens = (dir / "tokens.bin").string(),
                    ours = (dir / "engine.safetensors").string(),
                    ref = (dir / "torch.safetensors").string();
  std::ofstream(yaml) << yaml_of(config);
  {
    model::Gpt gpt(config, core::cpu_backend());
    randomise(gpt, 4242);
    model::save_weights(gpt, weights);
  }
  core::Rng rng(17);
  std::vector<uint16_t> ids(size_t(batch) * (config.seq_len + 1) + 5);
  for (auto& t : ids)
    t = static_cast<uint16_t>(rng.next_below(config.vocab_size));
  data::write_shard(tokens, ids);
  fs::remove(ours);
  fs::remove(ref);

  const std::string b = std::to_string(batch);
  const std::string engine_cmd = std::string(MODEL_GRAD_EXE) + " --config " + yaml + " --weights " +
                                 weights + " --tokens " + tokens + " --batch " + b + " --out " +
                                 ours;
  ASSERT_EQ(std::system(engine_cmd.c_str()), 0) << engine_cmd;
  const std::string torch_cmd = "/usr/bin/python3 " + std::string(TORCH_REFERENCE) + " --weights " +
                                weights + " --tokens " + tokens + " --batch " + b + " --out " + ref;
  ASSERT_EQ(std::system(torch_cmd.c_str()), 0) << torch_cmd;

  core::SafetensorsReader e(ours), r(ref);
  const float le = e.read("loss").to_vector()[0], lr = r.read("loss").to_vector()[0];
  // measured 0 in all four cases (the float64 losses differ by <= 3e-8 relative)
  EXPECT_TRUE(core::within(std::abs(le - lr) / std::abs(lr), 2e-7))
      << "loss engine " << le << " torch " << lr;
  const model::ParamTable table(config);
  ASSERT_EQ(e.tensors().size(), table.size() + 2);
  double worst = 0;
  std::string worst_name;
  for (const auto& p : table.params()) {
    const auto ge = e.read("grad/" + p.name).to_vector();
    const auto gr = r.read("grad/" + p.name).to_vector();
    ASSERT_EQ(ge.size(), gr.size()) << p.name;
    const core::Difference d = core::compare(ge, gr);
    double ref_sq = 0;
    for (float g : gr)
      ref_sq += double(g) * g;
    ASSERT_GT(ref_sq, 0.0) << p.name << ": the reference gradient is zero, the test is too weak";
    // measured 5.7e-7 .. 7.8e-7 (worst parameter of each case)
    EXPECT_TRUE(core::within(d.norm_rel(), 5e-6)) << "grad/" << p.name << " " << d.norm_rel();
    if (!(d.norm_rel() <= worst)) worst = d.norm_rel(), worst_name = p.name;
  }
  std::printf("parity %s: loss rel err %.2e, worst gradient rel err %.2e (%s)\n", name.c_str(),
              std::abs(le - lr) / std::abs(lr), worst, worst_name.c_str());
}

TEST(ModelParity, Gpt2) {
  run_case("gpt2", base(model::Arch::Gpt2), 3);
}

TEST(ModelParity, ModernSoftcap) {
  auto c = base(model::Arch::Modern);
  c.softcap = 3.0f;
  run_case("modern", c, 3);
}

TEST(ModelParity, ModernMoe) {
  auto c = base(model::Arch::Modern);
  c.softcap = 15.0f;
  c.moe_experts = 4;
  c.moe_top_k = 2;
  c.moe_aux_weight = 0.05f;
  run_case("modern_moe", c, 3);
}

TEST(ModelParity, Gpt2MoeTop1) {
  auto c = base(model::Arch::Gpt2);
  c.moe_experts = 3;
  c.moe_top_k = 1;
  c.moe_aux_weight = 0.05f;
  run_case("gpt2_moe", c, 2);
}

// model_grad reads the engine's config: --set applies and errors are the engine's messages.
TEST(ModelGrad, UsesTheEngineConfig) {
  const std::filesystem::path dir = std::filesystem::path(TEST_WORK_DIR) / "model_grad_config";
  std::filesystem::create_directories(dir);
  std::vector<uint16_t> ids(200);
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<uint16_t>(i % 256);
  data::write_shard((dir / "t.bin").string(), ids);
  const std::string base = std::string(MODEL_GRAD_EXE) + " --config " + ENGINE_SOURCE_DIR +
                           "/configs/tiny.yaml --tokens " + (dir / "t.bin").string() +
                           " --batch 2 --out " + (dir / "g.safetensors").string();
  auto output = [](const std::string& cmd, int& status) {
    std::string out;
    FILE* p = popen((cmd + " 2>&1").c_str(), "r");
    char buf[512];
    while (std::fgets(buf, sizeof(buf), p))
      out += buf;
    status = pclose(p);
    return out;
  };
  int status = 0;
  std::string out = output(base + " --set model.n_layer=1", status);
  ASSERT_EQ(status, 0) << out;
  core::SafetensorsReader grads((dir / "g.safetensors").string());
  EXPECT_TRUE(grads.contains("grad/blocks.0.attn.qkv.weight")) << out;
  EXPECT_FALSE(grads.contains("grad/blocks.1.attn.qkv.weight")) << "--set model.n_layer=1 ignored";
  out = output(base + " --set model.n_layers=1", status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("config error: --set model.n_layers=1: unknown key 'model.n_layers' (did "
                     "you mean 'model.n_layer'?)"),
            std::string::npos)
      << out;
  std::filesystem::remove_all(dir);
}

}  // namespace
