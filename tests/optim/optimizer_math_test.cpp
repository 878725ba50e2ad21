// The update rules on hand-computed cases, the orthogonaliser's two orientations, the momentum
// schedule and state handling.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "core/backend.h"
#include "core/check.h"
#include "core/compare.h"
#include "core/rng.h"
#include "optim/adamw/adamw.h"
#include "optim/muon/muon.h"
#include "optim/muon/muon_math.h"
#include "optim/muon/muon_ops.h"
#include "optim/muon/newton_schulz.h"
#include "tests/core/grad_check.h"
#include "tests/optim/cpu_context.h"
#include "tests/test_util.h"

using test_util::error_of;

using core::Tensor;

namespace {

optim::AdamWConfig adam_config(const std::string& yaml) {
  optim::HyperReader r(YAML::Load(yaml), "test");
  optim::AdamWConfig c = optim::AdamWConfig::from_yaml(r);
  r.finish();
  return c;
}

optim::MuonConfig muon_config(const std::string& yaml) {
  optim::HyperReader r(YAML::Load(yaml), "test");
  optim::MuonConfig c = optim::MuonConfig::from_yaml(r, optim::MuonConfig{});
  r.finish();
  return c;
}

}  // namespace

// Two steps of one element in float64 by hand, both eps placements.
TEST(AdamW, MatchesHandComputedStepsInBothEpsModes) {
  for (const bool torch : {false, true}) {
    optim::AdamW adam(adam_config(std::string("{lr: 0.1, betas: [0.9, 0.99], eps: 1.0e-3, "
                                              "weight_decay: 0.5, lr_mul: 2, wd_mul: 0.5, "
                                              "eps_mode: ") +
                                  (torch ? "torch}" : "spec}")));
    Tensor w = Tensor::from_vector({1}, std::vector<float>{1.0f});
    Tensor g = Tensor::from_vector({1}, std::vector<float>{0.3f});
    double W = 1.0, m = 0, v = 0;
    const double lr = 0.1 * 2 * 0.5;  // lr * lr_mul * lr_scale
    for (int t = 1; t <= 2; ++t) {
      const double G = t == 1 ? 0.3 : -0.2;
      g.at({0}) = static_cast<float>(G);
      optim::ParamShard p{"x", {1}, 0, w, g};
      optim::StepContext ctx;
      ctx.backend = &core::cpu_backend();
      ctx.step = t;
      ctx.lr_scale = 0.5;
      adam.step({&p, 1}, ctx);
      W *= 1 - lr * 0.5 * 0.5;
      m = 0.9 * m + 0.1 * G;
      v = 0.99 * v + 0.01 * G * G;
      const double bc1 = 1 - std::pow(0.9, t), bc2 = 1 - std::pow(0.99, t);
      W -= torch ? lr * (m / bc1) / (std::sqrt(v / bc2) + 1e-3)
                 : lr * std::sqrt(bc2) / bc1 * m / (std::sqrt(v) + 1e-3);
      EXPECT_NEAR(w.at({0}), W, 1e-6) << "torch=" << torch << " t=" << t;
    }
  }
}

TEST(AdamW, StateRoundTripAndErrors) {
  optim::AdamW a(adam_config("{}"));
  Tensor w = Tensor::from_vector({3}, std::vector<float>{1, 2, 3});
  Tensor g = Tensor::from_vector({3}, std::vector<float>{0.1f, -0.2f, 0.3f});
  optim::ParamShard p{"v", {3}, 0, w, g};
  a.step({&p, 1}, cpu_context());
  optim::OptimizerState s;
  a.save_state(s);
  EXPECT_EQ(s.counters.at("v/step"), 1);
  EXPECT_EQ(s.tensors.count("v/exp_avg"), 1u);
  EXPECT_EQ(s.tensors.count("v/exp_avg_sq"), 1u);
  optim::AdamW b(adam_config("{}"));
  b.load_state(s);
  Tensor w2 = w.clone();
  optim::ParamShard p2{"v", {3}, 0, w2, g};
  optim::StepContext ctx;
  ctx.backend = &core::cpu_backend();
  ctx.step = 2;
  a.step({&p, 1}, ctx);
  b.step({&p2, 1}, ctx);
  EXPECT_EQ(w.to_vector(), w2.to_vector());

  optim::OptimizerState bad = s;
  bad.tensors["v/momentum"] = Tensor::zeros({3});
  EXPECT_NE(error_of([&] { b.load_state(bad); }).find("unknown state tensor 'v/momentum'"),
            std::string::npos);
  // State of another shard size (other world size) is refused with the parameter's name.
  optim::AdamW c(adam_config("{}"));
  optim::OptimizerState other = s;
  other.tensors["v/exp_avg"] = Tensor::zeros({2});
  c.load_state(other);
  EXPECT_NE(error_of([&] {
              c.step({&p, 1}, cpu_context());
            }).find("'v/exp_avg' has shape [2]"),
            std::string::npos);
}

TEST(Muon, MomentumWarmupAndCooldown) {
  optim::MuonConfig c = muon_config(
      "{momentum: 0.95, momentum_start: 0.85, momentum_warmup_steps: 300, momentum_end: 0.85, "
      "momentum_cooldown_steps: 50}");
  EXPECT_DOUBLE_EQ(c.momentum_at(1, 1000), 0.85);
  EXPECT_NEAR(c.momentum_at(151, 1000), 0.90, 1e-12);
  EXPECT_DOUBLE_EQ(c.momentum_at(301, 1000), 0.95);
  EXPECT_DOUBLE_EQ(c.momentum_at(951, 1000), 0.95);
  EXPECT_NEAR(c.momentum_at(976, 1000), 0.90, 1e-12);
  EXPECT_NEAR(c.momentum_at(1001, 1000), 0.85, 1e-12);
  EXPECT_DOUBLE_EQ(muon_config("{momentum: 0.9}").momentum_at(1, 10), 0.9);
}

// ns_tf32 asks the device for TF32 GEMMs in the orthogonaliser; the CPU computes f32 either way,
// so a step there is the same bit for bit. A value that is not a boolean is refused by name.
TEST(Muon, NsTf32IsABooleanAndTheCpuComputesF32) {
  EXPECT_FALSE(muon_config("{}").ns_tf32);
  EXPECT_TRUE(muon_config("{ns_tf32: true}").ns_tf32);
  EXPECT_NE(error_of([] { muon_config("{ns_tf32: 3}"); }).find("ns_tf32"), std::string::npos);
  Tensor w0 = Tensor::empty({8, 12}), g = Tensor::empty({8, 12});
  core::fill_normal(w0, 1, 0.0f, 0.1f);
  core::fill_normal(g, 2, 0.0f, 1.0f);
  std::vector<std::vector<float>> after;
  for (const char* hyper : {"{}", "{ns_tf32: true}"}) {
    optim::Muon muon(muon_config(hyper));
    Tensor w = w0.clone();
    optim::ParamShard p{"blocks.0.attn.proj.weight", {8, 12}, 0, w, g};
    muon.step({&p, 1}, cpu_context());
    after.emplace_back(w.data<float>(), w.data<float>() + w.numel());
  }
  EXPECT_EQ(after[0], after[1]);
}

// ns_bf16 runs the orthogonaliser in bfloat16 as the record does, on the CPU too (unlike
// ns_tf32): a step moves the weights by about as much as in f32, but not by the same amounts.
TEST(Muon, NsBf16IsABooleanAndRoundsOnTheCpu) {
  EXPECT_FALSE(muon_config("{}").ns_bf16);
  EXPECT_TRUE(muon_config("{ns_bf16: true}").ns_bf16);
  EXPECT_NE(error_of([] { muon_config("{ns_bf16: yes please}"); }).find("ns_bf16"),
            std::string::npos);
  Tensor w0 = Tensor::empty({16, 24}), g = Tensor::empty({16, 24});
  core::fill_normal(w0, 1, 0.0f, 0.1f);
  core::fill_normal(g, 2, 0.0f, 1.0f);
  std::vector<std::vector<float>> moved;
  for (const char* hyper : {"{}", "{ns_bf16: true}"}) {
    optim::Muon muon(muon_config(hyper));
    Tensor w = w0.clone();
    optim::ParamShard p{"blocks.0.attn.proj.weight", {16, 24}, 0, w, g};
    muon.step({&p, 1}, cpu_context());
    std::vector<float> d(w.numel());
    for (int64_t i = 0; i < w.numel(); ++i)
      d[i] = w.data<float>()[i] - w0.data<float>()[i];
    moved.push_back(d);
  }
  EXPECT_NE(moved[0], moved[1]);
  EXPECT_LT(core::test::norm_rel_diff(moved[1], moved[0]), 0.05);
}

// ns_bf16_rounding: compiled (the default, the record's torch.compile'd function) or eager; any
// other value is refused naming the key; the two move the weights by other amounts.
TEST(Muon, NsBf16RoundingIsCompiledOrEager) {
  EXPECT_FALSE(muon_config("{}").ns_bf16_eager);
  EXPECT_FALSE(muon_config("{ns_bf16_rounding: compiled}").ns_bf16_eager);
  EXPECT_TRUE(muon_config("{ns_bf16_rounding: eager}").ns_bf16_eager);
  EXPECT_NE(error_of([] { muon_config("{ns_bf16_rounding: inductor}"); }).find("ns_bf16_rounding"),
            std::string::npos);
  Tensor w0 = Tensor::empty({16, 24}), g = Tensor::empty({16, 24});
  core::fill_normal(w0, 1, 0.0f, 0.1f);
  core::fill_normal(g, 2, 0.0f, 1.0f);
  std::vector<std::vector<float>> moved;
  for (const char* hyper : {"{ns_bf16: true}", "{ns_bf16: true, ns_bf16_rounding: eager}"}) {
    optim::Muon muon(muon_config(hyper));
    Tensor w = w0.clone();
    optim::ParamShard p{"blocks.0.attn.proj.weight", {16, 24}, 0, w, g};
    muon.step({&p, 1}, cpu_context());
    moved.push_back(w.to_vector());
  }
  EXPECT_NE(moved[0], moved[1]);
}

// The compiled function's element step: r(s x + r(p)), one f32 fused multiply-add of the stored
// bf16 terms rounded once to bf16 (optim::kmath::ns_bf16_fused_axpy), against the same in float64
// (s x exact, the sum rounded once to f32); and the eager step r(r(s x) + r(p)) differs from it.
TEST(Muon, Bf16FusedAxpyRoundsOnce) {
  int differ = 0;
  for (int i = 0; i < 100000; ++i) {
    const float s = -4.775f;
    const float x = optim::kmath::ns_round(static_cast<float>(core::rng_normal(1, i)));
    const float p = static_cast<float>(core::rng_normal(2, i));
    const float pr = optim::kmath::ns_round(p);
    const float want = optim::kmath::ns_round(static_cast<float>(double(s) * x + double(pr)));
    ASSERT_EQ(optim::kmath::ns_bf16_fused_axpy(s, x, p), want) << s << " " << x << " " << p;
    differ += optim::kmath::ns_bf16_axpy(s, x, p) != want;
  }
  std::printf("[ measured ] the eager rounding differs on %d of 100000\n", differ);
  EXPECT_GT(differ, 1000);
}

// Singular values of a well-conditioned input land in the band the spec gives for NS5 (about
// 0.68 to 1.2; NS5 is deliberately not convergent).
TEST(NewtonSchulz, SingularValuesNearOne) {
  const int64_t n = 32;
  Tensor x = Tensor::empty({n, n});
  core::fill_normal(x, 5, 0.0f, 0.1f);
  for (int64_t i = 0; i < n; ++i)
    x.at({i, i}) += 1.0f;
  optim::make_muon_ops(core::cpu_backend())
      ->newton_schulz(x.data<float>(), n, n, optim::ns5_schedule());
  Tensor u = Tensor::empty({n, n}), s = Tensor::empty({n}), vt = Tensor::empty({n, n});
  core::cpu_backend().svd(u.data<float>(), s.data<float>(), vt.data<float>(), x.data<float>(), n,
                          n);
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_GT(s.at({i}), 0.6f);
    EXPECT_LT(s.at({i}), 1.25f);
  }
}

TEST(Muon, RefusesRowShardsAndUnknownState) {
  optim::Muon muon(muon_config("{}"));
  Tensor w = Tensor::zeros({4, 8}), g = Tensor::zeros({4, 8});
  optim::ParamShard p{"blocks.0.attn.proj.weight", {8, 8}, 4, w, g};
  EXPECT_NE(error_of([&] {
              muon.step({&p, 1}, cpu_context());
            }).find("must be stepped whole (Owned"),
            std::string::npos);
  optim::OptimizerState s;
  s.tensors["w/exp_avg"] = Tensor::zeros({1});
  EXPECT_NE(error_of([&] { muon.load_state(s); }).find("unknown state tensor 'w/exp_avg'"),
            std::string::npos);
}

// One Muon step of a [2k, k] matrix viewed as two [k, k] blocks equals stepping the blocks as
// separate parameters; the view changes the result compared with one tall matrix.
TEST(Muon, MatrixViewsEqualSeparateBlocks) {
  const int64_t k = 8;
  Tensor w = Tensor::empty({2 * k, k}), g = Tensor::empty({2 * k, k});
  core::fill_normal(w, 1, 0.0f, 0.1f);
  core::fill_normal(g, 2, 0.0f, 1.0f);
  optim::Muon viewed(muon_config("{lr: 0.1, matrix_views: {'qkv': 2}}"));
  optim::Muon plain(muon_config("{lr: 0.1, matrix_views: {}}"));
  Tensor wv = w.clone();
  optim::ParamShard pv{"qkv", {2 * k, k}, 0, wv, g};
  viewed.step({&pv, 1}, cpu_context());
  Tensor tall = w.clone();
  optim::ParamShard pt{"qkv", {2 * k, k}, 0, tall, g};
  plain.step({&pt, 1}, cpu_context());
  for (int64_t b = 0; b < 2; ++b) {
    Tensor wb = w.slice(0, b * k, k).clone(), gb = g.slice(0, b * k, k).clone();
    optim::ParamShard pb{"block", {k, k}, 0, wb, gb};
    optim::Muon single(muon_config("{lr: 0.1}"));
    single.step({&pb, 1}, cpu_context());
    const auto expect = wb.to_vector(), got = wv.slice(0, b * k, k).clone().to_vector();
    for (size_t i = 0; i < expect.size(); ++i)
      EXPECT_FLOAT_EQ(got[i], expect[i]);
  }
  // ... and differs from one tall matrix (finite on both sides: a NaN is no difference).
  const core::Difference d = core::compare(wv.to_vector(), tall.to_vector());
  EXPECT_EQ(d.nonfinite(), 0);
  EXPECT_GT(d.max_abs(), 1e-3);
}
