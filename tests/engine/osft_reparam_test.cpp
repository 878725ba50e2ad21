// OSFT beside a real model: the tiny modern GPT is pretrained for a few AdamW steps, its hidden
// matrices are decomposed, and 50 OSFT steps run on real forward/backward gradients mapped to the
// factors. Checks: the reparametrised model starts from the pretrained weights, the chain rule
// through the model matches finite differences of the loss, the invariants U_high^T U_low = 0
// and V_low V_high^T = 0 hold to 1e-6 after 50 steps, the frozen singular triplets remain
// triplets of the dense weight the model reads, and the loss falls. And the dense weight model
// loading rebuilds from a checkpoint's factors, whose shapes are checked first.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <Eigen/Dense>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/rng.h"
#include "engine/reparam/osft_reparam.h"
#include "tests/test_util.h"

namespace {

using MatD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

MatD mat(const core::Tensor& t) {
  const int64_t rows = t.dim() == 2 ? t.size(0) : t.numel();
  const int64_t cols = t.dim() == 2 ? t.size(1) : 1;
  MatD m(rows, cols);
  const std::vector<float> v = t.to_vector();
  for (int64_t i = 0; i < rows * cols; ++i)
    m.data()[i] = v[static_cast<size_t>(i)];
  return m;
}

constexpr int kB = 4, kT = 32;

struct TinyRun {
  model::Gpt gpt;
  std::vector<int32_t> tokens, targets;
  std::vector<comm::ParamDesc> specs;

  TinyRun() : gpt(config(), core::cpu_backend()) {
    gpt.init_weights();
    core::Rng rng(7);
    for (int i = 0; i < kB * (kT + 1); ++i)
      tokens.push_back(static_cast<int32_t>(rng.next_uniform() * 256) % 256);
    targets.assign(tokens.begin() + 1, tokens.end());
    tokens.resize(static_cast<size_t>(kB * kT));
    targets.resize(static_cast<size_t>(kB * kT));
    for (const model::ParamInfo& p : gpt.table().params())
      specs.push_back({p.name, p.shape});
  }
  static model::ModelConfig config() {
    model::ModelConfig c;
    c.n_layer = 2;
    c.d_model = 64;
    c.n_head = 2;
    c.seq_len = kT;
    c.vocab_size = 256;
    return c;
  }
  float loss() { return gpt.eval_loss(tokens.data(), targets.data(), kB, kT); }
  float forward_backward() {
    gpt.zero_grad();
    const float l = gpt.forward(tokens.data(), targets.data(), kB, kT);
    gpt.backward();
    return l;
  }
  // The model's parameters that are not targets, as optimizer parts.
  std::vector<optim::ParamShard> dense_parts(const engine::OsftReparam* reparam) {
    std::vector<optim::ParamShard> out;
    for (size_t i = 0; i < gpt.table().size(); ++i) {
      const model::ParamInfo& p = gpt.table()[i];
      if (reparam == nullptr || !reparam->is_target(p.name))
        out.push_back({p.name, p.shape, 0, gpt.param(i), gpt.grad(i)});
    }
    return out;
  }
};

YAML::Node groups(double urr) {
  return YAML::Load(
      "- params: ['blocks.*.attn.qkv.weight', 'blocks.*.attn.proj.weight',"
      "             'blocks.*.mlp.fc.weight', 'blocks.*.mlp.proj.weight']\n"
      "  optimizer: osft\n  unfreeze_rank_ratio: " +
      std::to_string(urr) +
      "\n  lr: 3.0e-3\n"
      "- params: ['*']\n  optimizer: adamw\n  lr: 3.0e-3\n");
}

void pretrain(TinyRun& run, int steps) {
  optim::OptimizerSet adam(YAML::Load("- {params: ['*'], optimizer: adamw, lr: 1.0e-2}"),
                           run.specs);
  for (int t = 1; t <= steps; ++t) {
    run.forward_backward();
    optim::StepContext ctx;
    ctx.backend = &core::cpu_backend();
    ctx.step = t;
    adam.step(run.dense_parts(nullptr), ctx);
  }
}

}  // namespace

TEST(OsftReparam, FiftyRealStepsKeepTheInvariants) {
  TinyRun run;
  pretrain(run, 10);
  std::vector<core::Tensor> pretrained;
  for (size_t i = 0; i < run.gpt.table().size(); ++i)
    pretrained.push_back(run.gpt.param(i).clone());
  const float loss0 = run.loss();

  optim::OptimizerSet set(groups(0.25), run.specs);
  engine::OsftReparam reparam(run.gpt, set, nullptr, nullptr, &comm::shard_range);
  ASSERT_EQ(reparam.targets().size(), 8u);  // 4 matrices x 2 blocks
  for (const auto& t : reparam.targets()) {
    const double diff =
        (mat(run.gpt.param(t.param)) - mat(pretrained[t.param])).cwiseAbs().maxCoeff();
    EXPECT_LT(diff, 1e-5) << t.name;
  }
  EXPECT_NEAR(run.loss(), loss0, 1e-4);

  float first = 0, last = 0;
  for (int t = 1; t <= 50; ++t) {
    reparam.zero_grads();
    last = run.forward_backward();
    if (t == 1) first = last;
    for (int layer = -1; layer < 2; ++layer)
      reparam.map_grads(layer);
    std::vector<optim::ParamShard> parts = run.dense_parts(&reparam);
    for (engine::OsftReparam::Factor& f : reparam.factors())
      if (f.trained) parts.push_back({f.name, f.value.shape(), 0, f.value, f.grad});
    optim::StepContext ctx;
    ctx.backend = &core::cpu_backend();
    ctx.step = t;
    set.step(parts, ctx);
    reparam.write_all();
  }
  EXPECT_LT(last, first - 0.1f) << "OSFT should still fit the batch";
  const float tuned_loss = run.loss();
  for (size_t i = 0; i < reparam.targets().size(); ++i) {
    const optim::OsftFactors f = reparam.full(i);
    const MatD uh = mat(f.U_high), vh = mat(f.V_high);
    const std::string& name = reparam.targets()[i].name;
    EXPECT_LT((uh.transpose() * mat(f.U_low)).cwiseAbs().maxCoeff(), 1e-6) << name;
    EXPECT_LT((mat(f.V_low) * vh.transpose()).cwiseAbs().maxCoeff(), 1e-6) << name;
    // The dense weight the model reads still has the frozen triplets: U_high^T W V_high^T =
    // diag(S_high), up to the f32 rounding of W.
    const MatD w = mat(run.gpt.param(reparam.targets()[i].param));
    const MatD s = mat(f.S_high);
    const double drift =
        (uh.transpose() * w * vh.transpose() - MatD(s.col(0).asDiagonal())).cwiseAbs().maxCoeff();
    EXPECT_LT(drift, 1e-5 * std::max(1.0, s.maxCoeff())) << name;
    // ...while the weight itself moved.
    EXPECT_GT((w - mat(pretrained[reparam.targets()[i].param])).cwiseAbs().maxCoeff(), 1e-3)
        << name;
  }

  // Decomposing again from the tuned weights (what a next fine-tuning phase does) keeps the
  // model: the factors are a fresh SVD of the weights the model holds.
  reparam.redecompose(nullptr);
  EXPECT_NEAR(run.loss(), tuned_loss, 1e-4);
  for (size_t i = 0; i < reparam.targets().size(); ++i) {
    const optim::OsftFactors f = reparam.full(i);
    const MatD uh = mat(f.U_high), ul = mat(f.U_low);
    EXPECT_LT((uh.transpose() * ul).cwiseAbs().maxCoeff(), 1e-5) << reparam.targets()[i].name;
  }
}

// dL/dS_low through the real model (chain rule from the model's dW) against central differences
// of the loss.
TEST(OsftReparam, ChainRuleThroughTheModelMatchesFiniteDifferences) {
  TinyRun run;
  pretrain(run, 5);
  optim::OptimizerSet set(groups(0.5), run.specs);
  engine::OsftReparam reparam(run.gpt, set, nullptr, nullptr, &comm::shard_range);
  reparam.zero_grads();
  run.forward_backward();
  for (int layer = -1; layer < 2; ++layer)
    reparam.map_grads(layer);
  for (engine::OsftReparam::Factor& f : reparam.factors()) {
    if (!f.name.ends_with(".S_low")) continue;
    for (int64_t j : {int64_t{0}, f.value.numel() - 1}) {
      float* s = f.value.data<float>() + j;
      const float keep = *s, h = 2e-2f;
      *s = keep + h;
      reparam.write_all();
      const double up = run.loss();
      *s = keep - h;
      reparam.write_all();
      const double down = run.loss();
      *s = keep;
      reparam.write_all();
      const double fd = (up - down) / (2.0 * h);
      const double analytic = f.grad.data<float>()[j];
      EXPECT_NEAR(analytic, fd, 2e-3 + 0.05 * std::abs(fd)) << f.name << "[" << j << "]";
    }
  }
}

// Model loading rebuilds an OSFT target's dense weight from the factors a checkpoint holds (the
// trained ones as trainables, the frozen ones under osft/), with the op the trainer writes it
// with; factors that do not make the model's [N, M] are refused naming the parameter before
// anything is multiplied; a parameter without factors is no target (undefined).
TEST(OsftReparam, DenseWeightFromACheckpointsFactors) {
  const std::string root =
      (std::filesystem::temp_directory_path() / "engine_osft_dense_from_checkpoint").string();
  std::filesystem::remove_all(root);
  core::Rng rng(3);
  std::vector<float> values(12);
  for (float& v : values)
    v = static_cast<float>(rng.next_uniform() - 0.5);
  const optim::OsftFactors f = optim::osft_decompose(core::Tensor::from_vector({4, 3}, values), 1);
  std::vector<engine::SavedSlice> slices;
  for (const char* name : optim::kOsftFactorNames) {
    const core::Tensor& t = optim::factor_by_name(f, name);
    const std::string key = std::string(name).ends_with("_low") ? "param/w." : "osft/w.";
    slices.push_back({key + name, t.shape(), 0, 0, t});
  }
  // v: U_low one column too wide for k_high 1 of [4, 3].
  slices.push_back({"osft/v.U_high", {4, 1}, 0, 0, f.U_high});
  slices.push_back({"osft/v.S_high", {1}, 0, 0, f.S_high});
  slices.push_back({"osft/v.V_high", {1, 3}, 0, 0, f.V_high});
  slices.push_back({"param/v.U_low", {4, 3}, 0, 0, core::Tensor::zeros({4, 3})});
  slices.push_back({"param/v.S_low", {2}, 0, 0, f.S_low});
  slices.push_back({"param/v.V_low", {2, 3}, 0, 0, f.V_low});
  engine::prepare_staging(root, 1);
  engine::write_rank_file(engine::staging_path(root, 1), 0, slices);
  engine::Manifest m;
  m.step = 1;
  const engine::CheckpointReader reader(engine::commit_checkpoint(root, m, 1));

  const core::Tensor w =
      engine::OsftReparam::dense_from_checkpoint(reader, "w", {4, 3}, core::cpu_backend());
  const core::Tensor expected = optim::osft_reconstruct(f);
  ASSERT_EQ(w.shape(), expected.shape());
  EXPECT_EQ(std::memcmp(w.raw_data(), expected.raw_data(), w.nbytes()), 0);
  EXPECT_FALSE(engine::OsftReparam::dense_from_checkpoint(reader, "u", {4, 3}, core::cpu_backend())
                   .defined());
  const std::string err = test_util::error_of([&] {
    engine::OsftReparam::dense_from_checkpoint(reader, "v", {4, 3}, core::cpu_backend());
  });
  EXPECT_NE(err.find("the OSFT factors of v ([4, 3])"), std::string::npos) << err;
  std::filesystem::remove_all(root);
}
