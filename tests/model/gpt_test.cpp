#include "model/gpt.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "core/check.h"
#include "core/kernel_math.h"
#include "core/rng.h"
#include "tests/model/recipe_config.h"

namespace {

model::ModelConfig tiny(model::Arch arch, int vocab, int experts = 0) {
  model::ModelConfig c;
  c.arch = arch;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 16;
  c.seq_len = 8;
  c.vocab_size = vocab;
  c.moe_experts = experts;
  return c;
}

// Every key of the record recipe (tests/model/recipe_config.h) at a tiny size: documents start
// at token 1, and the window of 5 does not divide T = 8.
model::ModelConfig recipe(int vocab) {
  return test_model::with_recipe_keys(tiny(model::Arch::Modern, vocab), 7.5f * 4.0f,  // 7.5 sqrt(D)
                                      1);
}

std::vector<int32_t> random_tokens(size_t n, int vocab, uint64_t seed) {
  core::Rng rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t)
    x = static_cast<int32_t>(rng.next_below(vocab));
  return t;
}

class GptArch : public ::testing::TestWithParam<int> {
 protected:
  // 0: gpt2, 1: modern with soft-cap, 2: modern with MoE, 3: the record recipe; 4-7: the same
  // in bf16 precision.
  int arch() const { return GetParam() % 4; }
  model::ModelConfig config(int vocab) const {
    auto c = arch() == 3 ? recipe(vocab)
                         : tiny(arch() == 0 ? model::Arch::Gpt2 : model::Arch::Modern, vocab,
                                arch() == 2 ? 4 : 0);
    if (arch() == 1) c.softcap = 30.0f;
    if (GetParam() >= 4) c.precision = model::Precision::Bf16;
    return c;
  }
};

TEST_P(GptArch, LossAtInitIsNearLnV) {
  model::Gpt gpt(config(50257), core::cpu_backend());
  gpt.init_weights();
  const int B = 2, T = 8;
  auto x = random_tokens(B * T, 50257, 1), y = random_tokens(B * T, 50257, 2);
  const float loss = gpt.eval_loss(x.data(), y.data(), B, T);
  EXPECT_NEAR(loss, std::log(50257.0), 0.05);
}

TEST_P(GptArch, PaddedVocabRowsGetExactlyZeroGradient) {
  model::Gpt gpt(config(100), core::cpu_backend());  // padded to 128
  gpt.init_weights();
  // The recipe's value tables reach the loss only through the attention out-projections, zero
  // at init: give them values.
  for (size_t i = 0; i < gpt.table().size(); ++i) {
    if (!gpt.table()[i].name.ends_with("attn.proj.weight")) continue;
    core::Tensor w = gpt.param(i);
    for (int64_t e = 0; e < w.numel(); ++e)
      w.data<float>()[e] = static_cast<float>(0.1 * core::rng_normal(core::rng_hash(3, i), e));
  }
  gpt.params_updated();
  const int B = 2, T = 8;
  auto x = random_tokens(B * T, 100, 3), y = random_tokens(B * T, 100, 4);
  gpt.zero_grad();
  gpt.forward(x.data(), y.data(), B, T);
  gpt.backward();
  for (const auto& p : gpt.table().params()) {
    if (p.valid_rows < 0) continue;
    const auto g = gpt.grad(*gpt.table().find(p.name)).to_vector();
    const int64_t D = p.shape[1];
    double real = 0;
    for (int64_t e = 0; e < p.valid_rows * D; ++e)
      real += std::abs(g[e]);
    EXPECT_GT(real, 0.0) << p.name;
    for (int64_t e = p.valid_rows * D; e < p.numel; ++e) {
      ASSERT_EQ(g[e], 0.0f) << p.name << " padded row " << e / D;
    }
  }
}

TEST_P(GptArch, BackwardAccumulatesAndStepAllocatesNothing) {
  model::Gpt gpt(config(64), core::cpu_backend());
  gpt.init_weights();
  const int B = 2, T = 8;
  auto x = random_tokens(B * T, 64, 5), y = random_tokens(B * T, 64, 6);
  gpt.zero_grad();
  const float l1 = gpt.forward(x.data(), y.data(), B, T);
  gpt.backward();
  const auto g1 = gpt.grads().to_vector();
  const size_t live = core::cpu_allocator().live_bytes();
  const float l2 = gpt.forward(x.data(), y.data(), B, T);
  gpt.backward();
  EXPECT_EQ(core::cpu_allocator().live_bytes(), live);
  EXPECT_EQ(l1, l2);
  const auto g2 = gpt.grads().to_vector();
  for (size_t i = 0; i < g1.size(); ++i)
    ASSERT_FLOAT_EQ(g2[i], 2.0f * g1[i]) << i;
  EXPECT_FLOAT_EQ(gpt.eval_loss(x.data(), y.data(), B, T), gpt.ce_loss());
}

// The step's loss stays on the device: forward_accumulate() adds each micro-step's objective
// (cross-entropy plus aux loss, the value forward() returns) into a float64 sum that
// take_loss_sum() reads once and resets; the sum is the host loop's bit for bit, and the
// gradients are forward()'s.
TEST_P(GptArch, AccumulatedLossEqualsTheSumOfForwardLosses) {
  model::Gpt a(config(64), core::cpu_backend()), b(config(64), core::cpu_backend());
  a.init_weights();
  b.init_weights();
  const int B = 2, T = 8;
  double host_sum = 0.0;
  a.zero_grad();
  b.zero_grad();
  for (uint64_t m = 0; m < 3; ++m) {
    auto x = random_tokens(B * T, 64, 20 + m), y = random_tokens(B * T, 64, 30 + m);
    const float objective = a.forward(x.data(), y.data(), B, T);
    EXPECT_EQ(objective, a.ce_loss() + a.aux_loss());
    if (arch() == 2) {
      EXPECT_GT(a.aux_loss(), 0.0f);
    }
    host_sum += objective;
    a.backward();
    b.forward_accumulate(x.data(), y.data(), B, T);
    b.backward();
    EXPECT_EQ(b.ce_loss(), a.ce_loss());
  }
  EXPECT_EQ(b.take_loss_sum(), host_sum);
  EXPECT_EQ(b.take_loss_sum(), 0.0);  // taking resets
  const auto ga = a.grads().to_vector(), gb = b.grads().to_vector();
  for (size_t i = 0; i < ga.size(); ++i)
    ASSERT_EQ(ga[i], gb[i]) << i;
}

// ZeRO-3 style: storage released, each layer bound just before use from its own buffers (here
// copies of a flat model's parameters) and unbound after its backward; the numbers are the
// flat model's exactly and nothing stays resident.
TEST_P(GptArch, RebindingLayerStorageGivesTheSameLossAndGradients) {
  model::Gpt flat(config(64), core::cpu_backend()), bound(config(64), core::cpu_backend());
  flat.init_weights();
  std::vector<core::Tensor> values;
  for (size_t i = 0; i < flat.table().size(); ++i)
    values.push_back(flat.param(i).clone());
  bound.release_storage();
  EXPECT_FALSE(bound.params().defined());
  EXPECT_FALSE(bound.param(0).defined());
  const auto& table = bound.table();
  auto bind_layer = [&](int layer, bool grads) {
    for (size_t i = 0; i < table.size(); ++i) {
      if (table[i].layer != layer) continue;
      bound.bind_param(i, values[i]);
      if (grads) bound.bind_grad(i, core::Tensor::zeros(table[i].shape));
    }
  };
  std::vector<core::Tensor> grads(table.size());
  bound.set_layer_hook([&](model::Gpt::LayerEvent e, int l) {
    if (e == model::Gpt::LayerEvent::kBeforeForward) bind_layer(l, false);
    if (e == model::Gpt::LayerEvent::kBeforeBackward) bind_layer(l, true);
    if (e != model::Gpt::LayerEvent::kAfterBackward) return;
    for (size_t i = 0; i < table.size(); ++i) {
      if (table[i].layer != l) continue;
      grads[i] = bound.grad(i);
      bound.bind_param(i, core::Tensor());
      bound.bind_grad(i, core::Tensor());
    }
  });
  const int B = 2, T = 8;
  auto x = random_tokens(B * T, 64, 15), y = random_tokens(B * T, 64, 16);
  flat.zero_grad();
  const float lf = flat.forward(x.data(), y.data(), B, T);
  flat.backward();
  const float lb = bound.forward(x.data(), y.data(), B, T);
  bind_layer(-1, true);  // the head's backward runs before any layer event
  bound.backward();
  EXPECT_EQ(lf, lb);
  for (size_t i = 0; i < table.size(); ++i) {
    EXPECT_FALSE(bound.param(i).defined()) << table[i].name;
    ASSERT_TRUE(grads[i].defined()) << table[i].name;
    EXPECT_EQ(grads[i].to_vector(), flat.grad(i).to_vector()) << table[i].name;
  }
}

TEST_P(GptArch, LastLogitsGiveTheLossOfALengthOneSequence) {
  model::Gpt gpt(config(64), core::cpu_backend());
  gpt.init_weights();
  const int B = 3, T = 1;
  auto x = random_tokens(B * T, 64, 7), y = random_tokens(B * T, 64, 8);
  const auto logits = gpt.last_logits(x.data(), B, T);
  ASSERT_EQ(logits.size(), size_t(B) * 64);
  double loss = 0;
  for (int b = 0; b < B; ++b) {
    double mx = -1e30, z = 0;
    for (int v = 0; v < 64; ++v)
      mx = std::max(mx, double(logits[b * 64 + v]));
    for (int v = 0; v < 64; ++v)
      z += std::exp(logits[b * 64 + v] - mx);
    loss += mx + std::log(z) - logits[b * 64 + y[b]];
  }
  EXPECT_NEAR(gpt.eval_loss(x.data(), y.data(), B, T), loss / B, 1e-5);
}

// At T > 1 the last position's logits, not the first's: changing the target of the last
// position of row b from y to y' changes the mean loss by (z[y] - z[y']) / (B T), the logits of
// that position only (CE = log-sum-exp - z[target]).
TEST_P(GptArch, LastLogitsAreThoseOfTheLastPosition) {
  model::Gpt gpt(config(64), core::cpu_backend());
  gpt.init_weights();
  const int B = 3, T = 6;
  auto x = random_tokens(B * T, 64, 17), y = random_tokens(B * T, 64, 18);
  const auto logits = gpt.last_logits(x.data(), B, T);
  ASSERT_EQ(logits.size(), size_t(B) * 64);
  const double base = gpt.eval_loss(x.data(), y.data(), B, T);
  double largest = 0, worst = 0;
  for (int b = 0; b < B; ++b) {
    const int last = b * T + T - 1;
    for (int shift : {1, 17, 40}) {
      auto y2 = y;
      y2[last] = (y[last] + shift) % 64;
      const double moved = (gpt.eval_loss(x.data(), y2.data(), B, T) - base) * B * T;
      const double expect = logits[b * 64 + y[last]] - logits[b * 64 + y2[last]];
      largest = std::max(largest, std::abs(expect));
      worst = std::max(worst, std::abs(moved - expect));
      // float losses of ~ln 64 summed over B T = 18 positions: measured 4.5e-6 .. 7.7e-6
      EXPECT_NEAR(moved, expect, 2e-5) << "row " << b << " target " << y2[last];
    }
  }
  std::printf("[ measured ] last logits vs loss differences: %.3g, logit differences up to %.3g\n",
              worst, largest);
  EXPECT_GT(largest, 1e-2) << "the logit differences are too small to tell positions apart";
}

TEST_P(GptArch, OverfitsOneShortSequenceWithSgd) {
  auto c = config(50);
  c.d_model = 32;
  c.seq_len = 16;
  model::Gpt gpt(c, core::cpu_backend());
  gpt.init_weights();
  auto seq = random_tokens(17, 50, 9);
  std::vector<int32_t> x(seq.begin(), seq.end() - 1), y(seq.begin() + 1, seq.end());
  const int64_t n = gpt.table().total_numel();
  float loss = 0;
  int step = 0;
  // The recipe's sigmoid cap passes a quarter of the logit gradient at its tiny width (gain
  // cap / (4 scale) = 1/4): it needs more than the 400 steps the others converge in.
  for (; step < 800; ++step) {
    gpt.zero_grad();
    loss = gpt.forward(x.data(), y.data(), 1, 16);
    if (gpt.ce_loss() < 0.05f) break;
    gpt.backward();
    // Plain gradient descent: params -= lr * grads.
    gpt.backend().axpby(gpt.params().data<float>(), -0.5f, gpt.grads().data<float>(), 1.0f, n);
    gpt.params_updated();  // bf16: remake the weights' copies
  }
  EXPECT_LT(gpt.ce_loss(), 0.05f) << "after " << step << " steps, objective " << loss;
}

INSTANTIATE_TEST_SUITE_P(Archs, GptArch, ::testing::Range(0, 8), [](const auto& info) {
  const int a = info.param % 4;
  return std::string(a == 0   ? "Gpt2"
                     : a == 1 ? "ModernSoftcap"
                     : a == 2 ? "ModernMoe"
                              : "Recipe") +
         (info.param >= 4 ? "Bf16" : "");
});

// The recipe's backward against central differences of the float32 loss, per parameter along
// the analytic gradient g and along a random direction u (both unit): the slope must match
// <g, u> within 1% of |g| (a missing or wrong term moves it by O(|g|)). Weights are drawn wide
// and the learned scalars away from their init so that every path carries gradient; the
// float64 checks of the new kernels are in tests/core (KernelGrad.ScalarMix).
TEST(GptRecipe, GradientsMatchFiniteDifferences) {
  for (int variant : {0, 1, 2}) {
    const bool every_key = variant != 1;
    auto c = recipe(100);
    if (!every_key) c.softcap_form = model::SoftcapForm::Tanh, c.attn_scale = 0.0f;
    // The record's exact forms: windows of 3 blocks of 2 (short: 1 block), documents starting
    // mid-block; the FP8 head is checked against the reference's float64 straight-through rule
    // (ModelParity.RecordExact: eval_loss, which these differences take, does not round).
    if (variant == 2) c = test_model::with_record_exact(c, 2, 3, false);
    model::Gpt gpt(c, core::cpu_backend());
    const auto& table = gpt.table();
    for (size_t i = 0; i < table.size(); ++i) {
      core::Tensor p = gpt.param(i);
      const int64_t fan = table[i].shape.size() > 1 ? table[i].shape.back() : 1;
      float* d = p.data<float>();
      for (int64_t e = 0; e < p.numel(); ++e) {
        const double z = core::rng_normal(core::rng_hash(7, i), e);
        d[e] = table[i].shape.size() > 1 ? static_cast<float>(z / std::sqrt(double(fan)))
                                         : static_cast<float>(0.6 + 0.4 * z);
      }
    }
    gpt.params_updated();
    const int B = 2, T = 8;
    auto x = random_tokens(B * T, 100, 21), y = random_tokens(B * T, 100, 22);
    for (int32_t& t : x)
      if (t == 1) t = 2;
    x[3] = 1;      // row 0: documents [0, 3), [3, 8)
    x[T + 6] = 1;  // row 1: documents [0, 6), [6, 7), [7, 8): a one-token document
    x[T + 7] = 1;
    gpt.zero_grad();
    gpt.forward(x.data(), y.data(), B, T);
    gpt.backward();
    double worst = 0;
    for (size_t i = 0; i < table.size(); ++i) {
      const auto g = gpt.grad(i).to_vector();
      double gn = 0;
      for (float v : g)
        gn += double(v) * v;
      gn = std::sqrt(gn);
      ASSERT_GT(gn, 0) << table[i].name << " gets no gradient";
      std::vector<double> rnd(g.size());
      double rn = 0;
      for (size_t e = 0; e < g.size(); ++e)
        rnd[e] = core::rng_normal(core::rng_hash(8, i), e), rn += rnd[e] * rnd[e];
      for (int dir = 0; dir < 2; ++dir) {
        std::vector<double> u(g.size());
        double slope = 0;
        for (size_t e = 0; e < g.size(); ++e) {
          u[e] = dir == 0 ? g[e] / gn : rnd[e] / std::sqrt(rn);
          slope += u[e] * g[e];
        }
        float* w = gpt.param(i).data<float>();
        const std::vector<float> w0(w, w + g.size());
        auto loss_at = [&](double h) {
          for (size_t e = 0; e < g.size(); ++e)
            w[e] = static_cast<float>(w0[e] + h * u[e]);
          gpt.params_updated();
          return double(gpt.eval_loss(x.data(), y.data(), B, T));
        };
        const double h = 1e-2;
        const double fd = (loss_at(h) - loss_at(-h)) / (2 * h);
        loss_at(0);
        const double err = std::abs(fd - slope) / gn;
        worst = std::max(worst, err);
        EXPECT_LT(err, 1e-2) << table[i].name << (dir == 0 ? " along g" : " along u") << ": fd "
                             << fd << " analytic " << slope << " |g| " << gn;
      }
    }
    std::printf("[ measured ] recipe (%s) slopes vs central differences: %.3g of |g|\n",
                variant == 2 ? "the record's exact forms"
                : every_key  ? "every key"
                             : "tanh cap, default scale",
                worst);
  }
}

// The value-embedding tables, checked row-wise: a token's row gets exactly the gradient of the
// blocks' V through the lambdas, so moving one used row along its gradient changes the loss by
// the slope (a table row is used by every position holding that token).
TEST(GptRecipe, ValueEmbeddingRowsMatchFiniteDifferences) {
  auto c = recipe(100);
  c.value_embeds = 2;
  model::Gpt gpt(c, core::cpu_backend());
  gpt.init_weights();
  for (size_t i = 0; i < gpt.table().size(); ++i) {
    // wide weights, non-zero projections and head (the init zeroes them)
    core::Tensor p = gpt.param(i);
    float* d = p.data<float>();
    if (gpt.table()[i].shape.size() < 2) continue;
    const int64_t fan = gpt.table()[i].shape.back();
    for (int64_t e = 0; e < p.numel(); ++e)
      d[e] = static_cast<float>(core::rng_normal(core::rng_hash(9, i), e) / std::sqrt(double(fan)));
  }
  gpt.params_updated();
  const int B = 2, T = 8, D = c.d_model;
  auto x = random_tokens(B * T, 100, 23), y = random_tokens(B * T, 100, 24);
  gpt.zero_grad();
  gpt.forward(x.data(), y.data(), B, T);
  gpt.backward();
  for (int t = 0; t < 2; ++t) {
    const std::string name = "value_embeds." + std::to_string(t) + ".weight";
    const auto g = gpt.grad(name).to_vector();
    float* w = gpt.param(name).data<float>();
    for (int row : {x[0], x[5], x[11]}) {
      double gn = 0;
      for (int e = 0; e < D; ++e)
        gn += double(g[row * D + e]) * g[row * D + e];
      gn = std::sqrt(gn);
      ASSERT_GT(gn, 0) << name << " row " << row;
      const std::vector<float> w0(w + row * D, w + row * D + D);
      auto loss_at = [&](double h) {
        for (int e = 0; e < D; ++e)
          w[row * D + e] = static_cast<float>(w0[e] + h * g[row * D + e] / gn);
        gpt.params_updated();
        return double(gpt.eval_loss(x.data(), y.data(), B, T));
      };
      const double fd = (loss_at(1e-2) - loss_at(-1e-2)) / 2e-2;
      loss_at(0);
      EXPECT_NEAR(fd, gn, 1e-2 * gn) << name << " row " << row;
    }
  }
}

// Masked attention: a window of at least T and tokens without the document token give the plain
// causal loss exactly; a shorter window (set_attention_window, as the trainer grows it) changes
// it, and so does a document token.
TEST(GptRecipe, MaskedAttentionReducesToCausal) {
  auto plain = tiny(model::Arch::Modern, 64);
  auto masked = plain;
  masked.doc_bos = 1;
  masked.window = 8;
  model::Gpt a(plain, core::cpu_backend()), b(masked, core::cpu_backend());
  a.init_weights();
  b.init_weights();
  for (size_t i = 0; i < a.table().size(); ++i) {
    // non-zero projections, so attention reaches the loss
    core::Tensor p = a.param(i);
    for (int64_t e = 0; e < p.numel(); ++e)
      p.data<float>()[e] = static_cast<float>(0.2 * core::rng_normal(core::rng_hash(5, i), e));
    b.param(i).copy_from(p);
  }
  a.params_updated();
  b.params_updated();
  const int B = 2, T = 8;
  auto x = random_tokens(B * T, 64, 27), y = random_tokens(B * T, 64, 28);
  for (int32_t& t : x)
    if (t == 1) t = 2;
  const float causal = a.eval_loss(x.data(), y.data(), B, T);
  EXPECT_EQ(b.eval_loss(x.data(), y.data(), B, T), causal);
  b.set_attention_window(3);
  EXPECT_EQ(b.attention_window(), 3);
  EXPECT_NE(b.eval_loss(x.data(), y.data(), B, T), causal);
  b.set_attention_window(8);
  x[4] = 1;
  EXPECT_NE(b.eval_loss(x.data(), y.data(), B, T), a.eval_loss(x.data(), y.data(), B, T));
  EXPECT_THROW(a.set_attention_window(4), core::Error);  // no model.window
}

// The recipe's learned scalars start at the record's values, the head at zero when asked (the
// loss at init is then ln V exactly: every logit is equal), and a model with the keys off is
// today's: same parameter table, same loss.
TEST(GptRecipe, InitAndKeysOffAreToday) {
  auto c = recipe(64);
  c.zero_init_head = true;
  model::Gpt gpt(c, core::cpu_backend());
  gpt.init_weights();
  EXPECT_EQ(gpt.param("blocks.1.lambdas").to_vector(), (std::vector<float>{1.0f, 0.0f}));
  EXPECT_EQ(gpt.param("blocks.0.attn.v_lambdas").to_vector(), (std::vector<float>{0.5f, 0.5f}));
  EXPECT_EQ(gpt.param("skip_weights").to_vector(), (std::vector<float>{1.0f, 1.0f}));
  for (float v : gpt.param("lm_head.weight").to_vector())
    ASSERT_EQ(v, 0.0f);
  const int B = 2, T = 8;
  auto x = random_tokens(B * T, 64, 25), y = random_tokens(B * T, 64, 26);
  EXPECT_NEAR(gpt.eval_loss(x.data(), y.data(), B, T), std::log(64.0), 1e-5);

  auto off = tiny(model::Arch::Modern, 64);
  auto explicit_off = off;
  explicit_off.attn_scale = 1.0f / std::sqrt(8.0f);  // today's 1/sqrt(head_dim)
  model::Gpt a(off, core::cpu_backend()), b(explicit_off, core::cpu_backend());
  a.init_weights();
  b.init_weights();
  ASSERT_EQ(a.table().size(), b.table().size());
  EXPECT_EQ(a.eval_loss(x.data(), y.data(), B, T), b.eval_loss(x.data(), y.data(), B, T));
}

// bf16 precision against fp32 on the same weights and tokens. Each bf16 rounding moves a value
// by at most u = 2^-8 relative (unit roundoff of 8 significant bits); the loss and every
// gradient are sums over many rounded products whose errors mostly cancel. Bars: the loss within
// u of fp32's, each gradient within 4u in norm (measured below); and bf16 must differ from fp32
// at all (the copies and roundings took effect).
TEST(GptBf16, CloseToFp32OnTheSameWeights) {
  const double u = 0x1p-8;
  for (int a = 0; a < 3; ++a) {
    model::ModelConfig c =
        tiny(a == 0 ? model::Arch::Gpt2 : model::Arch::Modern, 64, a == 2 ? 4 : 0);
    c.d_model = 32;
    model::Gpt f32(c, core::cpu_backend());
    c.precision = model::Precision::Bf16;
    model::Gpt b16(c, core::cpu_backend());
    f32.init_weights();
    b16.init_weights();
    const int B = 2, T = 8;
    auto x = random_tokens(B * T, 64, 40 + a), y = random_tokens(B * T, 64, 50 + a);
    f32.zero_grad();
    b16.zero_grad();
    const float lf = f32.forward(x.data(), y.data(), B, T);
    const float lb = b16.forward(x.data(), y.data(), B, T);
    f32.backward();
    b16.backward();
    EXPECT_NE(lf, lb);
    EXPECT_NEAR(lb, lf, u * lf) << "arch " << a;
    double worst = 0;
    for (size_t i = 0; i < f32.table().size(); ++i) {
      const auto gf = f32.grad(i).to_vector(), gb = b16.grad(i).to_vector();
      double diff = 0, norm = 0;
      for (size_t e = 0; e < gf.size(); ++e) {
        diff += (double(gb[e]) - gf[e]) * (double(gb[e]) - gf[e]);
        norm += double(gf[e]) * gf[e];
      }
      if (norm == 0) continue;
      const double rel = std::sqrt(diff / norm);
      EXPECT_LE(rel, 4 * u) << f32.table()[i].name;
      worst = std::max(worst, rel);
    }
    std::printf(
        "[ measured ] arch %d: bf16 loss %.6f vs fp32 %.6f, worst gradient %.3g (bar %.3g)\n", a,
        lb, lf, worst, 4 * u);
  }
}

// In bf16 precision every matmul weight enters the forward and the backward only through its
// bf16 copy: moving each element halfway towards its bf16 value (which keeps that value) leaves
// the loss and every gradient bit for bit as they were, while the same move changes the fp32
// model's loss. The embeddings stay f32 lookups, so gpt2's tied embedding and the router are not
// moved.
TEST(GptBf16, MatmulWeightsEnterOnlyAsBf16) {
  for (int a = 0; a < 3; ++a) {
    for (model::Precision precision : {model::Precision::Bf16, model::Precision::Fp32}) {
      model::ModelConfig c =
          tiny(a == 0 ? model::Arch::Gpt2 : model::Arch::Modern, 64, a == 2 ? 4 : 0);
      c.precision = precision;
      model::Gpt gpt(c, core::cpu_backend());
      gpt.init_weights();
      const int B = 2, T = 8;
      auto x = random_tokens(B * T, 64, 70 + a), y = random_tokens(B * T, 64, 80 + a);
      gpt.zero_grad();
      const float before = gpt.forward(x.data(), y.data(), B, T);
      gpt.backward();
      const std::vector<float> grads = gpt.grads().to_vector();
      int moved = 0;
      for (size_t i = 0; i < gpt.table().size(); ++i) {
        const std::string& name = gpt.table()[i].name;
        const bool matmul = name.find(".weight") != std::string::npos &&
                            name.find("ln") == std::string::npos &&
                            name.find("router") == std::string::npos && name != "embed.weight" &&
                            name != "pos_embed.weight";
        if (!matmul) continue;
        float* w = gpt.param(i).data<float>();
        for (int64_t e = 0; e < gpt.table()[i].numel; ++e) {
          const float r = core::kmath::float_from_bf16(core::kmath::bf16_from_float(w[e]));
          moved += w[e] != r;
          w[e] = w[e] + (r - w[e]) / 2;
        }
      }
      ASSERT_GT(moved, 1000);
      gpt.params_updated();
      gpt.zero_grad();
      const float after = gpt.forward(x.data(), y.data(), B, T);
      gpt.backward();
      if (precision == model::Precision::Bf16) {
        EXPECT_EQ(after, before) << "arch " << a;
        EXPECT_EQ(gpt.grads().to_vector(), grads) << "arch " << a;
      } else {
        EXPECT_NE(after, before) << "arch " << a << ": the move does not reach the fp32 model";
      }
    }
  }
}

// In bf16 precision the GEMM inputs (the norms' outputs, the merged heads, the MLP activation,
// the MoE rows) and the output gradients their producers store (d pre, d qkv) are bf16 only, with
// no f32 array beside them: the activation plan is smaller than fp32's, although it adds the
// rounding scratch (before the storage change it was larger: f32 arrays and their bf16 copies).
TEST(GptBf16, StoresGemmInputsOnlyAsBf16) {
  for (int a = 0; a < 3; ++a) {
    size_t bytes[2] = {0, 0};
    for (int p = 0; p < 2; ++p) {
      model::ModelConfig c =
          tiny(a == 0 ? model::Arch::Gpt2 : model::Arch::Modern, 64, a == 2 ? 4 : 0);
      c.precision = p == 0 ? model::Precision::Fp32 : model::Precision::Bf16;
      model::Gpt gpt(c, core::cpu_backend());
      gpt.init_weights();
      const int B = 4, T = 8;
      auto x = random_tokens(B * T, 64, 90 + a), y = random_tokens(B * T, 64, 95 + a);
      gpt.forward(x.data(), y.data(), B, T);
      gpt.backward();
      bytes[p] = gpt.activation_bytes();
    }
    EXPECT_LT(bytes[1], bytes[0]) << "arch " << a;
    std::printf("[ measured ] arch %d: bf16 activation plan %.3f of fp32's\n", a,
                double(bytes[1]) / double(bytes[0]));
  }
}

// bf16 precision's head writes the logits in bf16 only and the cross-entropy writes d logits over
// them: per column of the padded vocabulary the plan holds 2 N bytes (the bf16 logits, then
// d logits) and 2 B bytes (the last positions' bf16 logits for sampling); fp32 holds 4 N + 4 B.
// (Before the bf16 head it held 4 N + 2 N + 4 B: f32 logits beside the bf16 d logits.) Measured
// as the plan's growth from a padded vocabulary of 128 to 256.
TEST(GptBf16, LogitsAreStoredOnlyAsBf16) {
  for (int a = 0; a < 3; ++a) {
    for (model::Precision precision : {model::Precision::Fp32, model::Precision::Bf16}) {
      const int B = 4, T = 8, N = B * T;
      size_t bytes[2] = {0, 0};
      for (int v = 0; v < 2; ++v) {
        model::ModelConfig c = tiny(a == 0 ? model::Arch::Gpt2 : model::Arch::Modern,
                                    v == 0 ? 128 : 256, a == 2 ? 4 : 0);
        c.precision = precision;
        model::Gpt gpt(c, core::cpu_backend());
        gpt.init_weights();
        auto x = random_tokens(B * T, c.vocab_size, 90 + a),
             y = random_tokens(B * T, c.vocab_size, 95 + a);
        gpt.forward(x.data(), y.data(), B, T);
        gpt.backward();
        bytes[v] = gpt.activation_bytes();
      }
      const size_t per_column = precision == model::Precision::Bf16 ? 2 * N + 2 * B : 4 * N + 4 * B;
      EXPECT_EQ(bytes[1] - bytes[0], per_column * 128)
          << "arch " << a << (precision == model::Precision::Bf16 ? " bf16" : " fp32");
    }
  }
}

// The validation loss in bf16 precision is the training loss: eval_loss reads the same bf16
// logits with the same cross-entropy (the losses only), bit for bit; every arch, the recipe's
// sigmoid soft-cap over the padded vocabulary (model.loss_over_padding) included.
TEST(GptBf16, EvalLossIsTheTrainingLoss) {
  for (int a = 0; a < 4; ++a) {
    model::ModelConfig c =
        a == 3 ? recipe(100)
               : tiny(a == 0 ? model::Arch::Gpt2 : model::Arch::Modern, 100, a == 2 ? 4 : 0);
    if (a == 1) c.softcap = 30.0f;
    if (a == 3) c.loss_over_padding = true;
    c.precision = model::Precision::Bf16;
    model::Gpt gpt(c, core::cpu_backend());
    gpt.init_weights();
    const int B = 2, T = 8;
    auto x = random_tokens(B * T, 100, 110 + a), y = random_tokens(B * T, 100, 120 + a);
    const float eval = gpt.eval_loss(x.data(), y.data(), B, T);
    gpt.zero_grad();
    gpt.forward(x.data(), y.data(), B, T);
    EXPECT_EQ(gpt.ce_loss(), eval) << "arch " << a;
  }
}

// GPT-2's bf16 activation plan against fp32's, array by array: the saved GEMM inputs (ln1,
// attention's output, ln2 [N, D], the activation [N, F]; the final norm; the last positions
// [B, D]) are bf16 only, attention writes its output and d qkv in bf16 itself (no f32 [N, D]
// output, no f32 [N, 3 D] d qkv beside the bf16 ones), the f32 d pre is gone; bf16 adds the
// rounding scratch d y [N, D], d pre [N, F] and d qkv [N, 3 D]; the logits [N, Vp] and the last
// positions' [B, Vp] are bf16 (d logits written over them); the residual stream (the embedding
// output, each block's res_mid and res_out [N, D]) is bf16 only, its gradient f32 as in fp32.
// Sizes are multiples of 32 elements, so no array is padded to its 64-byte boundary.
TEST(GptBf16, Gpt2PlanKeepsNoF32BesideBf16) {
  size_t bytes[2] = {0, 0};
  model::ModelConfig c = tiny(model::Arch::Gpt2, 64);
  const int B = 4, T = 8;
  for (int p = 0; p < 2; ++p) {
    c.precision = p == 0 ? model::Precision::Fp32 : model::Precision::Bf16;
    model::Gpt gpt(c, core::cpu_backend());
    gpt.init_weights();
    auto x = random_tokens(B * T, 64, 97), y = random_tokens(B * T, 64, 98);
    gpt.forward(x.data(), y.data(), B, T);
    gpt.backward();
    bytes[p] = gpt.activation_bytes();
  }
  const int64_t L = c.n_layer, N = int64_t(B) * T, D = c.d_model, F = c.d_ff(),
                Vp = c.padded_vocab();
  // 4 bytes an element in f32, 2 in bf16.
  const int64_t per_layer = (4 - 2) * (3 * N * D + N * F);    // ln1, attention out, ln2; act
  const int64_t stored = (4 - 2) * (N * D + int64_t(B) * D);  // final norm, last positions
  const int64_t f32_grads = 4 * (3 * N * D + N * F);          // d qkv, d pre
  const int64_t bf16_scratch = 2 * (N * D + N * F + 3 * N * D);
  const int64_t logits = (4 - 2) * (N + int64_t(B)) * Vp;
  const int64_t stream = (4 - 2) * (1 + 2 * L) * N * D;  // encoded; res_mid, res_out
  EXPECT_EQ(int64_t(bytes[0]) - int64_t(bytes[1]),
            L * per_layer + stored + f32_grads - bf16_scratch + logits + stream);
}

// The bf16 copies of the matmul weights are made at their first use after params_updated():
// weights written in place and announced give exactly the loss of a model that never ran
// before them (its copies are made at its first forward).
TEST(GptBf16, ParamsUpdatedRemakesTheCopies) {
  model::ModelConfig c = tiny(model::Arch::Modern, 64);
  c.precision = model::Precision::Bf16;
  model::Gpt gpt(c, core::cpu_backend()), fresh(c, core::cpu_backend());
  gpt.init_weights();
  fresh.init_weights();
  const int B = 2, T = 8;
  auto x = random_tokens(B * T, 64, 60), y = random_tokens(B * T, 64, 61);
  const float before = gpt.eval_loss(x.data(), y.data(), B, T);
  const int64_t n = gpt.table().total_numel();
  for (model::Gpt* m : {&gpt, &fresh})
    m->backend().scale(m->params().data<float>(), 1.5f, n);
  gpt.params_updated();
  const float after = gpt.eval_loss(x.data(), y.data(), B, T);
  EXPECT_NE(after, before);
  EXPECT_EQ(after, fresh.eval_loss(x.data(), y.data(), B, T));
}

// Every token takes top_k dispatch rows in every MoE layer: the counts per layer add up to
// B * T * top_k per forward, over the forwards since the last take, which starts them again.
TEST(Gpt, ExpertRowsCountEveryTokensSlotsPerLayer) {
  model::ModelConfig c = tiny(model::Arch::Modern, 64, 4);
  model::Gpt gpt(c, core::cpu_backend());
  gpt.init_weights();
  const int B = 2, T = 8;
  auto x = random_tokens(B * T, 64, 5), y = random_tokens(B * T, 64, 6);
  EXPECT_TRUE(gpt.take_expert_rows().empty());
  gpt.forward_accumulate(x.data(), y.data(), B, T);
  gpt.forward_accumulate(y.data(), x.data(), B, T);
  const std::vector<int64_t> rows = gpt.take_expert_rows();
  ASSERT_EQ(rows.size(), static_cast<size_t>(c.n_layer * c.moe_experts));
  for (int l = 0; l < c.n_layer; ++l) {
    int64_t sum = 0;
    for (int e = 0; e < c.moe_experts; ++e)
      sum += rows[l * c.moe_experts + e];
    EXPECT_EQ(sum, 2 * B * T * c.moe_top_k) << "layer " << l;
  }
  EXPECT_TRUE(gpt.take_expert_rows().empty());
  gpt.take_loss_sum();
  model::Gpt dense(tiny(model::Arch::Modern, 64), core::cpu_backend());
  dense.init_weights();
  dense.forward_accumulate(x.data(), y.data(), B, T);
  EXPECT_TRUE(dense.take_expert_rows().empty());
}

// Record #89's loss terms (Gpt::set_loss_weights): the weights {1} and 0 are the plain loss bit
// for bit; with offsets and a prefix weight the training forward's objective grows by the extra
// terms (every term >= 0) while eval_loss stays the plain cross-entropy (the gradient: parity
// test ModelParity.MultiTokenAndPrefixLoss). Bad weights and tables are refused by name.
TEST(Gpt, LossWeightsChangeTrainingOnly) {
  const int V = 64, B = 2, T = 8;
  model::Gpt gpt(recipe(V), core::cpu_backend());
  gpt.init_weights();
  const auto x = random_tokens(B * T, V, 3), y = random_tokens(B * T, V, 4);
  const float plain = gpt.forward(x.data(), y.data(), B, T);
  const float eval = gpt.eval_loss(x.data(), y.data(), B, T);
  gpt.set_loss_weights({1.0}, 0.0);
  EXPECT_EQ(gpt.forward(x.data(), y.data(), B, T), plain);

  std::vector<int32_t> prefix_of(V);
  for (int v = 0; v < V; ++v)
    prefix_of[v] = v < 8 ? -1 : v / 2;
  gpt.set_prefix_table(prefix_of);
  gpt.set_loss_weights({1.0, 0.5, 0.25}, 0.25);
  const float terms = gpt.forward(x.data(), y.data(), B, T);
  EXPECT_GT(terms, 1.5f * plain);
  EXPECT_EQ(gpt.eval_loss(x.data(), y.data(), B, T), eval);
  gpt.set_loss_weights({1.0}, 0.0);
  EXPECT_EQ(gpt.forward(x.data(), y.data(), B, T), plain);

  EXPECT_THROW(gpt.set_loss_weights({}, 0.0), core::Error);
  EXPECT_THROW(gpt.set_loss_weights({1, 1, 1, 1, 1}, 0.0), core::Error);
  EXPECT_THROW(gpt.set_loss_weights({1, -0.5}, 0.0), core::Error);
  prefix_of[9] = 9;  // a token is not its own proper prefix
  try {
    gpt.set_prefix_table(prefix_of);
    FAIL() << "a token its own prefix was accepted";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 9's prefix 9"), std::string::npos) << e.what();
  }
  EXPECT_THROW(gpt.set_prefix_table(std::vector<int32_t>(V - 1, -1)), core::Error);
  model::Gpt fresh(recipe(V), core::cpu_backend());
  EXPECT_THROW(fresh.set_loss_weights({1.0}, 0.25), core::Error);  // no prefix table
}

TEST(Gpt, RefusesBadInputs) {
  model::Gpt gpt(tiny(model::Arch::Modern, 64), core::cpu_backend());
  gpt.init_weights();
  std::vector<int32_t> x(8, 1), y(8, 2);
  EXPECT_THROW(gpt.backward(), core::Error);
  x[5] = 64;
  try {
    gpt.forward(x.data(), y.data(), 1, 8);
    FAIL() << "token 64 accepted";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("position 5"), std::string::npos) << e.what();
  }
  x[5] = 1;
  EXPECT_THROW(gpt.forward(x.data(), y.data(), 1, 9), core::Error);  // T > seq_len
  gpt.eval_loss(x.data(), y.data(), 1, 8);
  EXPECT_THROW(gpt.backward(), core::Error);  // eval keeps no gradient state
}

}  // namespace

namespace {

TEST(Gpt, LayerHookOrder) {
  model::Gpt gpt(tiny(model::Arch::Gpt2, 64), core::cpu_backend());
  gpt.init_weights();
  std::string log;
  gpt.set_layer_hook([&](model::Gpt::LayerEvent e, int l) {
    const char* tag = e == model::Gpt::LayerEvent::kBeforeForward    ? "F"
                      : e == model::Gpt::LayerEvent::kAfterForward   ? "E"
                      : e == model::Gpt::LayerEvent::kBeforeBackward ? "B"
                                                                     : "A";
    log += tag + std::to_string(l) + " ";
  });
  std::vector<int32_t> x(8, 1), y(8, 2);
  gpt.forward(x.data(), y.data(), 1, 8);
  gpt.backward();
  EXPECT_EQ(log, "F-1 E-1 F0 E0 F1 E1 F2 E2 B2 A2 B1 A1 B0 A0 A-1 ");
}

}  // namespace

namespace {

TEST(Gpt, SmallerShapeReusesThePlan) {
  auto c = tiny(model::Arch::Modern, 64, 2);
  model::Gpt a(c, core::cpu_backend()), b(c, core::cpu_backend());
  a.init_weights();
  b.init_weights();
  auto x = random_tokens(16, 64, 11), y = random_tokens(16, 64, 12);
  a.forward(x.data(), y.data(), 2, 8);
  const size_t live = core::cpu_allocator().live_bytes();
  const float small = a.eval_loss(x.data(), y.data(), 1, 5);
  EXPECT_EQ(core::cpu_allocator().live_bytes(), live);
  EXPECT_EQ(small, b.eval_loss(x.data(), y.data(), 1, 5));
  EXPECT_EQ(a.last_logits(x.data(), 3, 2), b.last_logits(x.data(), 3, 2));
}

}  // namespace
