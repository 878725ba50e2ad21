// Each layer of model/layers/ on its own: its backward against central differences of its forward
// (tests/model/layer_rig.h), with respect to its input stream and to each of its parameters, in
// float32 precision on the CPU (the bf16 paths: GptBf16 and the parity tests; the whole model
// against its recorded outputs: golden_outputs_test.cpp). The loss of a stream layer is
// <output, w> for a fixed random w; the head's is its own cross-entropy.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/kernel_math.h"
#include "core/rng.h"
#include "model/layers/bigram_embedding.h"
#include "model/layers/causal_attention.h"
#include "model/layers/coefficient_mlp.h"
#include "model/layers/fp8_head.h"
#include "model/layers/lm_head.h"
#include "model/layers/mlp.h"
#include "model/layers/moe.h"
#include "model/layers/rotary_attention.h"
#include "model/layers/skip_gate.h"
#include "model/layers/stream_mix.h"
#include "model/layers/stream_tap.h"
#include "model/layers/token_embedding.h"
#include "model/layers/unet_skip.h"
#include "model/layers/value_embeddings.h"
#include "model/layers/x0_lambdas.h"
#include "tests/model/layer_rig.h"
#include "tests/model/recipe_config.h"

namespace {

using test_model::expect_slopes;
using test_model::LayerRig;
using test_model::random_floats;

constexpr int kB = 2, kT = 8, kVocab = 64;

model::ModelConfig small(model::Arch arch) {
  model::ModelConfig c;
  c.arch = arch;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 16;
  c.seq_len = kT;
  c.vocab_size = kVocab;
  return c;
}

// Every recipe key and the record's exact forms (4 blocks: LSSL windows of 3 blocks of 2 tokens,
// block 2 MLP only, one value table for blocks 0 and 3), at D 32 (two heads of 16: the truncated
// rotary needs head_dim >= 8).
model::ModelConfig record(bool head_fp8 = false) {
  model::ModelConfig c = small(model::Arch::Modern);
  c.d_model = 32;
  c = test_model::with_recipe_keys(c, 30.0f, 1);
  return test_model::with_record_exact(c, 2, 3, head_fp8);
}

// Record #89's MUDD wiring is written for 11 blocks of 6 heads: D 48, head_dim 8.
model::ModelConfig mudd_config() {
  model::ModelConfig c = small(model::Arch::Modern);
  c.n_layer = model::ModelConfig::kMuddBlocks;
  c.n_head = model::ModelConfig::kMuddHeads;
  c.d_model = 48;
  c.no_attn_layers = {model::ModelConfig::kMuddSkipBlock};
  c.sublayer_lambdas = true;
  c.mudd = true;
  return c;
}

void fill_tokens(LayerRig& rig, uint64_t seed) {
  core::Rng rng(seed);
  for (int32_t& t : rig.tokens())
    t = static_cast<int32_t>(rng.next_below(rig.config().vocab_size));
  for (int32_t& t : rig.targets())
    t = static_cast<int32_t>(rng.next_below(rig.config().vocab_size));
  if (rig.config().doc_bos < 0) return;
  for (int32_t& t : rig.tokens())
    if (t == rig.config().doc_bos) t = rig.config().doc_bos + 1;
  // Row 0: documents [0, 3), [3, 8); row 1: [0, 6), [6, 7), [7, 8).
  const int32_t bos = rig.config().doc_bos;
  rig.tokens()[3] = bos;
  rig.tokens()[kT + 6] = bos;
  rig.tokens()[kT + 7] = bos;
}

// The attention masks planned with the rig's chain, made from its tokens.
void plan_with_masks(LayerRig& rig, model::AttentionMasks& masks) {
  rig.also_plan([&](model::ActivationPlan& plan) { masks.plan(plan, rig.ctx()); });
  rig.plan();
  masks.set_tokens(rig.ctx(), rig.tokens().data());
}

// The chain's loss <output, w>: d input and the gradient of every parameter whose name starts
// with one of `owned` (each must get one) against central differences.
// rig.plan() has run.
void check_chain(LayerRig& rig, const std::string& name, const std::vector<std::string>& owned,
                 bool check_input = true) {
  const size_t ND = static_cast<size_t>(rig.ctx().N() * rig.config().d_model);
  rig.input() = random_floats(ND, 3);
  // w half the input: the scalar mixes' gradients <input, w> are not small by chance.
  std::vector<float> w = random_floats(ND, 4);
  for (size_t i = 0; i < ND; ++i)
    w[i] += 0.5f * rig.input()[i];
  rig.forward();
  rig.params().zero_grad();
  const std::vector<float> dx = rig.backward(&w);
  auto loss = [&] { return test_model::weighted_sum(rig.forward(), w); };
  if (check_input) expect_slopes(name + ", d input", rig.input().data(), dx, loss);
  int checked = 0;
  for (size_t i = 0; i < rig.params().table().size(); ++i) {
    const std::string& p = rig.params().table()[i].name;
    bool mine = false;
    for (const std::string& prefix : owned)
      mine = mine || p.rfind(prefix, 0) == 0;
    if (!mine) continue;
    ++checked;
    expect_slopes(name + ", d " + p, rig.params().param(i).data<float>(),
                  rig.params().grad(i).to_vector(), loss, 1e-2, 1e-2,
                  [&] { rig.params().params_updated(); });
  }
  EXPECT_GT(checked, 0) << name << ": no parameter matched";
}

TEST(Layers, TokenEmbedding) {
  for (model::Arch arch : {model::Arch::Gpt2, model::Arch::Modern}) {
    for (bool x0_norm : {false, true}) {
      if (arch == model::Arch::Gpt2 && x0_norm) continue;
      model::ModelConfig c = small(arch);
      c.x0_norm = x0_norm;
      LayerRig rig(c, kB, kT);
      fill_tokens(rig, 1);
      rig.add(std::make_unique<model::TokenEmbedding>(rig.ctx()));
      rig.draw_params(5);
      rig.plan();
      check_chain(
          rig,
          std::string("token embedding ") + model::arch_name(arch) + (x0_norm ? " x0_norm" : ""),
          {"embed.weight", "pos_embed.weight"}, false);
    }
  }
}

// Record #34's smear inside the token embedding (before x0's norm): d embed, d smear_gate and
// d smear_lambda, rows of 8 crossing the rig's tokens.
TEST(Layers, Smear) {
  model::ModelConfig c = small(model::Arch::Modern);
  c.x0_norm = true;
  c.smear = true;
  LayerRig rig(c, kB, kT);
  fill_tokens(rig, 13);
  rig.add(std::make_unique<model::TokenEmbedding>(rig.ctx()));
  rig.draw_params(14);
  rig.plan();
  check_chain(rig, "token embedding with smear", {"embed.weight", "smear_gate", "smear_lambda"},
              false);
}

// Record #89's bigram hash embedding: the source and its injections at block 0's start and after
// block 1's attention (an MLP between them so the stream's gradient changes): d input, d table
// (11 rows for 16 positions: rows shared, their gradients summed, signs differing) and each
// block's gate.
TEST(Layers, BigramEmbedding) {
  model::ModelConfig c = small(model::Arch::Modern);
  c.bigram_rows = 11;
  LayerRig rig(c, kB, kT);
  fill_tokens(rig, 15);
  const model::BigramSource* bigram = rig.add(std::make_unique<model::BigramSource>(rig.ctx()));
  rig.add(std::make_unique<model::BigramInject>(rig.ctx(), 0, *bigram));
  rig.add(std::make_unique<model::Mlp>(rig.ctx(), 0));
  rig.add(std::make_unique<model::BigramInject>(rig.ctx(), 1, *bigram));
  rig.draw_params(16);
  rig.plan();
  check_chain(rig, "bigram embedding",
              {"bigram_embed.weight", "blocks.0.bigram_gate", "blocks.1.bigram_gate"});
}

// The forward's rows: bg[t] = table[hash[t]] * S[sign row of t], with the record's hash (h[0] =
// m, h[1] from m in place of x[0]) and S a fixed draw of +-1 (the same on every call).
TEST(Layers, BigramEmbeddingRows) {
  model::ModelConfig c = small(model::Arch::Modern);
  c.bigram_rows = 11;
  LayerRig rig(c, 1, kT);
  fill_tokens(rig, 17);
  const model::BigramSource* bigram = rig.add(std::make_unique<model::BigramSource>(rig.ctx()));
  rig.add(std::make_unique<model::BigramInject>(rig.ctx(), 0, *bigram));
  rig.draw_params(18);
  rig.plan();
  rig.forward();
  const int64_t D = c.d_model, m = c.bigram_rows - 1;
  const core::Tensor signs = model::bigram_sign_table(D);
  EXPECT_EQ(signs.to_vector(), model::bigram_sign_table(D).to_vector());
  int minus = 0;
  for (float v : signs.to_vector())
    minus += v < 0;
  EXPECT_NEAR(minus, signs.numel() / 2, 3 * std::sqrt(signs.numel() / 4.0));
  const float* table = rig.params().value(rig.params().index("bigram_embed.weight"));
  const std::vector<int32_t>& x = rig.tokens();
  for (int64_t t = 0; t < kT; ++t) {
    const int32_t prev = t == 0 ? 0 : t == 1 ? static_cast<int32_t>(m) : x[t - 1];
    const int64_t want =
        t == 0 ? m : ((int64_t{36313} * x[t]) ^ (int64_t{27191} * prev)) % m;  // small
    const int64_t s = t == 0 ? 0 : (x[t - 1] ^ x[t]) % model::kBigramSignRows;
    for (int64_t d = 0; d < D; ++d)
      EXPECT_EQ(bigram->bg()[t * D + d], table[want * D + d] * signs.data<float>()[s * D + d])
          << "t " << t << " d " << d;
  }
}

// The value table reaches the stream only through the attention blocks that mix it into v.
TEST(Layers, ValueEmbeddingsThroughAttention) {
  LayerRig rig(record(), kB, kT);
  fill_tokens(rig, 2);
  model::AttentionMasks masks(rig.config());
  model::ValueEmbeddings* tables = rig.add(std::make_unique<model::ValueEmbeddings>(rig.ctx()));
  rig.add(std::make_unique<model::RotaryAttention>(rig.ctx(), 0, masks, tables));
  rig.draw_params(6);
  plan_with_masks(rig, masks);
  check_chain(rig, "value table into block 0's v", {"value_embeds.0"}, false);
}

TEST(Layers, X0Lambdas) {
  model::ModelConfig c = small(model::Arch::Modern);
  c.x0_lambdas = true;
  LayerRig rig(c, kB, kT);
  const model::StreamTap* x0 = rig.add(std::make_unique<model::StreamTap>());
  rig.add(std::make_unique<model::X0Lambdas>(rig.ctx(), 0, *x0));
  rig.add(std::make_unique<model::X0Lambdas>(rig.ctx(), 1, *x0));
  rig.draw_params(7);
  rig.plan();
  check_chain(rig, "x0 lambdas", {"blocks.0.lambdas", "blocks.1.lambdas"});
}

TEST(Layers, UnetSkip) {
  model::ModelConfig c = small(model::Arch::Modern);
  c.unet_skips = true;  // 2 blocks: block 1 adds skip_weights[0] x (block 0's output)
  LayerRig rig(c, kB, kT);
  const model::StreamTap* source = rig.add(std::make_unique<model::StreamTap>());
  rig.add(std::make_unique<model::Mlp>(rig.ctx(), 0));  // something between the two ends
  rig.add(std::make_unique<model::SkipAdd>(rig.ctx(), 0, *source));
  rig.draw_params(8);
  rig.plan();
  check_chain(rig, "U-net skip", {"skip_weights"});
}

// A reader of per-token coefficients for the tests (host loops, CPU backend): out[n, d] =
// x[n, d] (1 + c[n, d mod K]), so every coefficient reaches the loss.
class CoefReader : public model::Layer {
 public:
  explicit CoefReader(const model::CoefficientMlp& producer) : producer_(producer) {}
  void plan(model::ActivationPlan& plan, const model::Context& ctx) override {
    out_ = plan.f32(ctx.N() * ctx.config.d_model);
  }
  model::Stream forward(model::Context& ctx, model::Stream x) override {
    in_ = x.f32;
    const int64_t D = ctx.config.d_model;
    for (int64_t i = 0; i < ctx.N() * D; ++i)
      out_[i] = in_[i] * (1.0f + producer_.view().values[at(i, D)]);
    return {out_, nullptr};
  }
  void backward(model::Context& ctx) override {
    const int64_t D = ctx.config.d_model;
    const model::CoefView c = producer_.view();
    for (int64_t i = 0; i < ctx.N() * D; ++i) {
      c.grads[at(i, D)] += ctx.dres[i] * in_[i];
      ctx.dres[i] *= 1.0f + c.values[at(i, D)];
    }
  }

 private:
  int64_t at(int64_t i, int64_t D) const {
    return (i / D) * producer_.view().stride + (i % D) % producer_.count();
  }
  const model::CoefficientMlp& producer_;
  const float* in_ = nullptr;
  float* out_ = nullptr;
};

// Record #89's coefficient MLPs (11 blocks of 6 heads at D 48): gate 0 with the learned scale
// shared by the gates (26 coefficients), and the last MUDD block with its constant 0.1 (5), each
// read by a CoefReader after a ReLU^2 MLP block between them.
TEST(Layers, CoefficientMlp) {
  LayerRig rig(mudd_config(), kB, kT);
  auto* gate = rig.add(
      std::make_unique<model::CoefficientMlp>(rig.ctx(), "mudd_gate.0", 0.0f, "mudd_gate.scale"));
  EXPECT_EQ(gate->count(), 26);
  rig.add(std::make_unique<model::Mlp>(rig.ctx(), 0));
  auto* mudd = rig.add(std::make_unique<model::CoefficientMlp>(rig.ctx(), "mudd.1", 0.1f));
  EXPECT_EQ(mudd->count(), 5);
  rig.add(std::make_unique<CoefReader>(*gate));
  rig.add(std::make_unique<CoefReader>(*mudd));
  rig.draw_params(13);
  rig.plan();
  check_chain(rig, "coefficient MLPs", {"mudd_gate.0.", "mudd_gate.scale", "mudd.1."});
}

// The coefficients themselves against (gelu(x W1^T) W2^T + b) 0.1 in float64, with the exact
// GELU, and the stream handed on unchanged.
TEST(Layers, CoefficientMlpValues) {
  const model::ModelConfig c = mudd_config();
  LayerRig rig(c, kB, kT);
  auto* mudd = rig.add(std::make_unique<model::CoefficientMlp>(rig.ctx(), "mudd.0", 0.1f));
  rig.draw_params(14);
  rig.plan();
  const int64_t N = rig.ctx().N(), D = c.d_model, H = model::CoefficientMlp::kHidden,
                K = mudd->count();
  ASSERT_EQ(K, 14);
  rig.input() = random_floats(static_cast<size_t>(N * D), 15);
  const model::Stream out = rig.forward();
  EXPECT_EQ(out.f32, rig.input().data());
  const auto& table = rig.params().table();
  const float* w1 = rig.params().param(*table.find("mudd.0.w1")).data<float>();
  const float* w2 = rig.params().param(*table.find("mudd.0.w2")).data<float>();
  const float* b2 = rig.params().param(*table.find("mudd.0.b2")).data<float>();
  double worst = 0.0, scale = 0.0;
  for (int64_t n = 0; n < N; ++n) {
    std::vector<double> act(static_cast<size_t>(H));
    for (int64_t j = 0; j < H; ++j) {
      double pre = 0.0;
      for (int64_t d = 0; d < D; ++d)
        pre += double(rig.input()[n * D + d]) * w1[j * D + d];
      act[j] = 0.5 * pre * (1.0 + std::erf(pre / std::sqrt(2.0)));
    }
    for (int64_t k = 0; k < K; ++k) {
      double z = b2[k];
      for (int64_t j = 0; j < H; ++j)
        z += act[j] * w2[k * H + j];
      worst = std::max(worst, std::abs(0.1 * z - mudd->view().values[n * K + k]));
      scale = std::max(scale, std::abs(0.1 * z));
    }
  }
  std::printf("[ measured ] coefficient MLP values: max error %.3g of max %.3g\n", worst, scale);
  EXPECT_LT(worst, 1e-5 * scale);
}

// Record #89's sublayer wiring on block 1: the attention's output alone, mixed as
// rho x + pi y + g_x0 x0 with g_x0 a per-token column of MUDD gate 0 (column 20, block 1's x0
// gate), then the MLP's as rho x + pi y; then block 2's attention reading x0's tap instead of
// the stream (with the residual add), as blocks 8-10 read cache7.
TEST(Layers, SublayerMixesAndTaps) {
  model::ModelConfig c = mudd_config();
  c.sublayer_lambdas = true;
  LayerRig rig(c, kB, kT);
  fill_tokens(rig, 5);
  model::AttentionMasks masks(rig.config());
  auto index = [&](const std::string& name) { return rig.params().index(name); };
  auto* x0 = rig.add(std::make_unique<model::StreamTap>());
  auto* gate = rig.add(
      std::make_unique<model::CoefficientMlp>(rig.ctx(), "mudd_gate.0", 0.0f, "mudd_gate.scale"));
  auto* attn_in = rig.add(std::make_unique<model::StreamTap>());
  rig.add(std::make_unique<model::RotaryAttention>(rig.ctx(), 1, masks, nullptr,
                                                   model::BranchWiring{true, nullptr}));
  rig.add(std::make_unique<model::StreamMix>(std::vector<model::MixTerm>{
      {model::scalar_param(index("blocks.1.resid_lambdas"), 0), attn_in},
      {model::scalar_param(index("blocks.1.post_lambdas"), 0), nullptr},
      {model::column_of(*gate, 20), x0}}));
  auto* mlp_in = rig.add(std::make_unique<model::StreamTap>());
  rig.add(std::make_unique<model::Mlp>(rig.ctx(), 1, model::BranchWiring{true, nullptr}));
  rig.add(std::make_unique<model::StreamMix>(std::vector<model::MixTerm>{
      {model::scalar_param(index("blocks.1.resid_lambdas"), 1), mlp_in},
      {model::scalar_param(index("blocks.1.post_lambdas"), 1), nullptr}}));
  rig.add(std::make_unique<model::RotaryAttention>(rig.ctx(), 2, masks, nullptr,
                                                   model::BranchWiring{false, x0}));
  rig.draw_params(16);
  plan_with_masks(rig, masks);
  check_chain(rig, "sublayer mixes and taps",
              {"blocks.1.resid_lambdas", "blocks.1.post_lambdas", "blocks.1.attn.", "blocks.1.mlp.",
               "blocks.2.attn.", "mudd_gate.0.", "mudd_gate.scale"});
}

// Every term form of the mix: the first term without a coefficient, per-token columns of a
// MUDD block (as its last block's (1 + mu5) x + mu3 cache0 + mu4 cache7), the same source twice.
TEST(Layers, StreamMixPerTokenTerms) {
  LayerRig rig(mudd_config(), kB, kT);
  auto* cache0 = rig.add(std::make_unique<model::StreamTap>());
  rig.add(std::make_unique<model::Mlp>(rig.ctx(), 0));
  auto* cache7 = rig.add(std::make_unique<model::StreamTap>());
  rig.add(std::make_unique<model::Mlp>(rig.ctx(), 1));
  auto* mu = rig.add(std::make_unique<model::CoefficientMlp>(rig.ctx(), "mudd.0", 0.1f));
  rig.add(std::make_unique<model::StreamMix>(
      std::vector<model::MixTerm>{{model::CoefOf{}, nullptr},
                                  {model::column_of(*mu, 5), nullptr},
                                  {model::column_of(*mu, 3), cache0},
                                  {model::column_of(*mu, 4), cache7}}));
  rig.draw_params(17);
  rig.plan();
  check_chain(rig, "stream mix, per-token terms", {"mudd.0.", "blocks.0.mlp.", "blocks.1.mlp."});
}

// Record #89's skip in block 6: x + sigmoid(skip_lambda) g_skip cache3, g_skip MUDD gate 1's
// column 28, cache3 a tap with an MLP block after it.
TEST(Layers, SkipGate) {
  LayerRig rig(mudd_config(), kB, kT);
  auto* cache3 = rig.add(std::make_unique<model::StreamTap>());
  rig.add(std::make_unique<model::Mlp>(rig.ctx(), 3));
  auto* gate = rig.add(
      std::make_unique<model::CoefficientMlp>(rig.ctx(), "mudd_gate.1", 0.0f, "mudd_gate.scale"));
  auto* skip = rig.add(
      std::make_unique<model::SkipGate>(rig.ctx(), "skip_lambda", model::column_of(*gate, 28)));
  rig.add(std::make_unique<model::StreamMix>(std::vector<model::MixTerm>{
      {model::CoefOf{}, nullptr},
      {[skip](const model::Context&, bool) { return skip->view(); }, cache3}}));
  rig.draw_params(18);
  rig.plan();
  check_chain(rig, "skip gate",
              {"skip_lambda", "mudd_gate.1.", "mudd_gate.scale", "blocks.3.mlp."});
}

// ZeRO stage 3 binds a parameter's gradient only around its layer's backward: the mixes and the
// skip gate must not look their scalars' gradients up in the forward. Every value bound, no
// gradient, forward; then the gradients bound and the backward.
TEST(Layers, MixesAndSkipGateReadNoGradientInTheForward) {
  LayerRig rig(mudd_config(), kB, kT);
  auto index = [&](const std::string& name) { return rig.params().index(name); };
  auto* cache3 = rig.add(std::make_unique<model::StreamTap>());
  auto* gate = rig.add(
      std::make_unique<model::CoefficientMlp>(rig.ctx(), "mudd_gate.1", 0.0f, "mudd_gate.scale"));
  auto* skip = rig.add(
      std::make_unique<model::SkipGate>(rig.ctx(), "skip_lambda", model::column_of(*gate, 28)));
  rig.add(std::make_unique<model::StreamMix>(std::vector<model::MixTerm>{
      {model::scalar_param(index("blocks.1.resid_lambdas"), 0), cache3},
      {model::scalar_param(index("blocks.1.post_lambdas"), 0), nullptr},
      {[skip](const model::Context&, bool) { return skip->view(); }, cache3}}));
  rig.draw_params(19);
  rig.plan();
  model::ParamStore& store = rig.params();
  std::vector<core::Tensor> values, grads;
  for (size_t i = 0; i < store.table().size(); ++i) {
    values.push_back(store.param(i).clone());
    grads.push_back(core::Tensor::zeros(store.param(i).shape()));
  }
  store.release_storage();
  for (size_t i = 0; i < values.size(); ++i)
    store.bind_param(i, values[i]);
  rig.input() = random_floats(static_cast<size_t>(rig.ctx().N() * rig.config().d_model), 20);
  EXPECT_NO_THROW(rig.forward());
  for (size_t i = 0; i < grads.size(); ++i)
    store.bind_grad(i, grads[i]);
  const std::vector<float> w = random_floats(rig.input().size(), 21);
  EXPECT_NO_THROW(rig.backward(&w));
  EXPECT_NE(grads[index("skip_lambda")].to_vector()[0], 0.0f);
}

struct AttentionCase {
  std::string name;
  model::ModelConfig config;
  int block;
};

// GPT-2's (CausalAttention) and the modern blocks' (RotaryAttention), with each mask and option.
TEST(Layers, Attention) {
  model::ModelConfig windowed = small(model::Arch::Modern);
  windowed.window = 3;  // token-granular sliding window, no documents
  model::ModelConfig docs = small(model::Arch::Modern);
  docs.doc_bos = 1;
  docs.attn_scale = 0.2f;
  model::ModelConfig key_offset = record();
  key_offset.key_offset = true;
  key_offset.window_pattern = "LLSL";  // block 1 long (and without a value table)
  model::ModelConfig qkvo = record();
  qkvo.qkvo_lambdas = true;
  // Record #89's paired heads in block 1: 4 heads (slots pairing heads 0, 2 and 1, 3), token
  // windows of 5 (long) and 2 (short) on the interleaved sequence of 2T, documents.
  model::ModelConfig paired = record();
  paired.n_head = 4;
  paired.window = 5;
  paired.window_block = 0;
  paired.paired_head_layers = {1};
  // Record #89's XSA and output gate (block 1, long; alpha and gate drawn random).
  model::ModelConfig corrected = record();
  corrected.window_pattern = "LLSL";
  corrected.xsa_layers = {1};
  corrected.attn_gate_layers = {1};
  model::ModelConfig gated_paired = paired;
  gated_paired.attn_gate_layers = {1};
  model::ModelConfig paired_long = paired;
  paired_long.window_pattern = "LLSL";
  paired_long.key_offset = true;
  const std::vector<AttentionCase> cases = {
      {"gpt2 (LayerNorm, biases, q k v in place)", small(model::Arch::Gpt2), 0},
      {"modern (QK-norm, rotary)", small(model::Arch::Modern), 0},
      {"modern, sliding window", windowed, 0},
      {"modern, documents, scale 0.2", docs, 1},
      {"the record's, block 1 (short block window, v lambdas without a table)", record(), 1},
      {"record #89's key offset, block 1 (long block window)", key_offset, 1},
      {"record #89's QKV and O weight lambdas, block 1", qkvo, 1},
      {"record #89's paired heads, block 1 (short window)", paired, 1},
      {"record #89's XSA and output gate, block 1", corrected, 1},
      {"record #89's output gate on paired heads, block 1", gated_paired, 1},
      {"record #89's paired heads, block 1 (long window, no key offset there)", paired_long, 1},
  };
  for (const AttentionCase& k : cases) {
    LayerRig rig(k.config, kB, kT);
    fill_tokens(rig, 3);
    model::AttentionMasks masks(rig.config());
    if (k.config.arch == model::Arch::Gpt2) {
      rig.add(std::make_unique<model::CausalAttention>(rig.ctx(), k.block, masks));
    } else {
      rig.add(std::make_unique<model::RotaryAttention>(rig.ctx(), k.block, masks, nullptr));
    }
    rig.draw_params(9);
    plan_with_masks(rig, masks);
    const std::string b = "blocks." + std::to_string(k.block) + ".";
    check_chain(rig, "attention " + k.name, {b + "ln1.", b + "attn."});
  }
}

// Record #89's YaRN: the window grown from 3 to 8 tokens rescales the rotary (the truncated one's
// two frequencies at head dim 8: 1 turns 0.48 times over 3 tokens, so both are interpolated by
// 3 / 8) and the scale (by 1 + 0.2 ln(8 / 3)); the backward goes through the rescaled rotary, in
// an unpaired block and a paired one.
TEST(Layers, AttentionYarn) {
  for (int block : {0, 1}) {
    model::ModelConfig c = record();
    c.n_head = 4;
    c.window = 8;
    c.window_block = 0;
    c.value_embeds = 0;
    c.yarn = true;
    c.paired_head_layers = {1};
    LayerRig rig(c, kB, kT);
    fill_tokens(rig, 5);
    model::AttentionMasks masks(rig.config());
    rig.add(std::make_unique<model::RotaryAttention>(rig.ctx(), block, masks, nullptr));
    rig.draw_params(14);
    masks.set_window(3);
    masks.set_window(8);
    plan_with_masks(rig, masks);
    const float* f = masks.rotary_frequencies();  // the CPU's device memory is the host's
    ASSERT_NE(f, nullptr);
    EXPECT_FLOAT_EQ(f[0], 3.0f / 8.0f);
    EXPECT_FLOAT_EQ(f[1], 3.0f / 8.0f / 1024.0f);
    EXPECT_EQ(f[2], 0.0f);
    EXPECT_FLOAT_EQ(masks.attention_scale(), 0.12f * (1.0f + 0.2f * std::log(8.0f / 3.0f)));
    const std::string b = "blocks." + std::to_string(block) + ".";
    check_chain(rig, "attention with YaRN, block " + std::to_string(block),
                {b + "ln1.", b + "attn."});
  }
}

// The short window set apart from the long one (record #89's stages: 6 long, 2 short), token
// granular and in blocks of 2 (a short window of 4 = 2 blocks), against half the long one.
TEST(Layers, AttentionMasksTakeAShortWindowApart) {
  for (int block : {0, 2}) {
    model::ModelConfig c = small(model::Arch::Modern);
    c.window = 6;
    c.window_block = block;
    c.window_pattern = "LS";
    LayerRig rig(c, 1, kT);
    fill_tokens(rig, 6);
    model::AttentionMasks masks(rig.config());
    rig.add(std::make_unique<model::Mlp>(rig.ctx(), 0));
    plan_with_masks(rig, masks);
    const int short_window = block == 0 ? 2 : 4;
    for (int set : {0, short_window}) {
      masks.set_window(6, true, set);
      masks.set_tokens(rig.ctx(), rig.tokens().data());
      const int32_t* begin = masks.mask(true).key_begin;  // the CPU's device memory is the host's
      for (int t = 0; t < kT; ++t) {
        const int w = set > 0 ? set : 3;  // else half the long window
        const int want = block == 0 ? std::max(0, t - w + 1)
                                    : std::max(0, (t / block - std::max(1, w / block) + 1) * block);
        EXPECT_EQ(begin[t], want) << "block " << block << " short " << set << " t " << t;
      }
    }
  }
  model::ModelConfig c = small(model::Arch::Modern);
  c.window = 6;
  model::AttentionMasks masks(c);
  EXPECT_THROW(masks.set_window(6, true, 7), core::Error);  // longer than the long one
}

TEST(Layers, Mlp) {
  for (model::Arch arch : {model::Arch::Gpt2, model::Arch::Modern}) {
    LayerRig rig(small(arch), kB, kT);
    rig.add(std::make_unique<model::Mlp>(rig.ctx(), 1));
    rig.draw_params(10);
    rig.plan();
    check_chain(rig, std::string("MLP ") + (arch == model::Arch::Gpt2 ? "GELU" : "ReLU^2"),
                {"blocks.1.ln2.", "blocks.1.mlp."});
  }
}

// The routing is piecewise constant in the weights: steps of 1e-2 along the gradient keep every
// token's top-k here (a flip would show as a large error).
TEST(Layers, Moe) {
  model::ModelConfig c = small(model::Arch::Modern);
  c.moe_experts = 4;
  c.moe_top_k = 2;
  c.moe_aux_weight = 0.05f;
  LayerRig rig(c, kB, kT);
  rig.add(std::make_unique<model::Moe>(rig.ctx(), 0));
  rig.draw_params(11);
  rig.plan();
  check_chain(rig, "MoE", {"blocks.0.moe."});
}

// The head's loss is its own mean cross-entropy (ctx.losses[0]).
void check_head(LayerRig& rig, const std::string& name, const std::vector<std::string>& owned) {
  const size_t ND = static_cast<size_t>(rig.ctx().N() * rig.config().d_model);
  rig.input() = random_floats(ND, 13);
  rig.forward();
  rig.params().zero_grad();
  const std::vector<float> dx = rig.backward(nullptr);
  auto loss = [&] {
    rig.ctx().want_grad = false;
    rig.forward();
    rig.ctx().want_grad = true;
    return double(rig.losses()[0]);
  };
  expect_slopes(name + ", d input", rig.input().data(), dx, loss);
  for (size_t i = 0; i < rig.params().table().size(); ++i) {
    const std::string& p = rig.params().table()[i].name;
    bool mine = false;
    for (const std::string& prefix : owned)
      mine = mine || p.rfind(prefix, 0) == 0;
    if (!mine) continue;
    expect_slopes(name + ", d " + p, rig.params().param(i).data<float>(),
                  rig.params().grad(i).to_vector(), loss, 1e-2, 1e-2,
                  [&] { rig.params().params_updated(); });
  }
}

TEST(Layers, LmHeadSoftcapForms) {
  model::ModelConfig tied = small(model::Arch::Gpt2);  // LayerNorm, the embedding as the head
  model::ModelConfig tanh_cap = small(model::Arch::Modern);
  tanh_cap.softcap = 3.0f;
  model::ModelConfig sigmoid_cap = record();  // 30 sigmoid(z / 30), the loss over the padding
  for (const auto& [name, c] : std::vector<std::pair<std::string, model::ModelConfig>>{
           {"gpt2 tied", tied}, {"tanh cap 3", tanh_cap}, {"sigmoid cap", sigmoid_cap}}) {
    LayerRig rig(c, kB, kT);
    fill_tokens(rig, 4);
    rig.add(std::make_unique<model::LmHead>(rig.ctx()));
    rig.draw_params(12, 4.0);
    rig.plan();
    check_head(rig, "head " + name,
               {c.arch == model::Arch::Gpt2 ? "embed.weight" : "lm_head.weight", "ln_f."});
  }
}

}  // namespace
