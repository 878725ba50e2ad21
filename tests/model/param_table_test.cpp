#include "model/param_table.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/check.h"

namespace {

model::ModelConfig tiny(model::Arch arch, int experts = 0) {
  model::ModelConfig c;
  c.arch = arch;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 8;
  c.seq_len = 4;
  c.vocab_size = 70;
  c.moe_experts = experts;
  return c;
}

TEST(ParamTable, ModernNamesShapesAndOffsets) {
  model::ParamTable t(tiny(model::Arch::Modern));
  std::vector<std::string> names;
  for (const auto& p : t.params())
    names.push_back(p.name);
  const std::vector<std::string> expect = {"embed.weight",
                                           "blocks.0.attn.qkv.weight",
                                           "blocks.0.attn.proj.weight",
                                           "blocks.0.mlp.fc.weight",
                                           "blocks.0.mlp.proj.weight",
                                           "blocks.1.attn.qkv.weight",
                                           "blocks.1.attn.proj.weight",
                                           "blocks.1.mlp.fc.weight",
                                           "blocks.1.mlp.proj.weight",
                                           "lm_head.weight"};
  EXPECT_EQ(names, expect);
  EXPECT_EQ(t.at("embed.weight").shape, (core::Shape{128, 8}));  // 70 padded to 128
  EXPECT_EQ(t.at("embed.weight").valid_rows, 70);
  EXPECT_EQ(t.at("blocks.1.mlp.fc.weight").shape, (core::Shape{32, 8}));
  EXPECT_EQ(t.at("blocks.1.mlp.fc.weight").layer, 1);
  EXPECT_EQ(t.at("lm_head.weight").kind, model::ParamKind::Head);
  EXPECT_EQ(t.at("lm_head.weight").layer, 2);  // the head unit, after the 2 blocks
  EXPECT_EQ(t.at("embed.weight").layer, -1);
  EXPECT_EQ(t.at("blocks.0.attn.proj.weight").init, model::InitRule::Zero);
  int64_t offset = 0;
  for (const auto& p : t.params()) {
    EXPECT_EQ(p.offset, offset) << p.name;
    offset += p.numel;
  }
  EXPECT_EQ(offset, t.total_numel());
  EXPECT_THROW(t.at("blocks.2.attn.qkv.weight"), core::Error);
}

TEST(ParamTable, Gpt2AndMoeParameters) {
  model::ParamTable g(tiny(model::Arch::Gpt2));
  EXPECT_EQ(g.at("pos_embed.weight").shape, (core::Shape{4, 8}));
  EXPECT_EQ(g.at("blocks.0.attn.qkv.bias").shape, (core::Shape{24}));
  EXPECT_EQ(g.at("ln_f.weight").init, model::InitRule::One);
  EXPECT_FALSE(g.find("lm_head.weight").has_value());  // tied to embed.weight
  model::ParamTable m(tiny(model::Arch::Modern, 3));
  EXPECT_EQ(m.at("blocks.1.moe.router.weight").shape, (core::Shape{3, 8}));
  EXPECT_EQ(m.at("blocks.1.moe.fc.weight").shape, (core::Shape{3, 32, 8}));
  EXPECT_EQ(m.at("blocks.1.moe.proj.weight").shape, (core::Shape{3, 8, 32}));
  EXPECT_EQ(m.at("blocks.1.moe.fc.weight").kind, model::ParamKind::ExpertMatrix);
  EXPECT_FALSE(m.find("blocks.0.mlp.fc.weight").has_value());
}

TEST(ParamTable, ShardInitEqualsWholeInitAndPaddingIsZero) {
  model::ParamTable t(tiny(model::Arch::Gpt2));
  const size_t i = *t.find("embed.weight");
  const auto& p = t[i];
  core::Tensor whole = core::Tensor::empty(p.shape);
  t.init_host(i, whole, 42);
  const auto w = whole.to_vector();
  // Two uneven shards filled independently give the same values.
  const int64_t cut = 333;
  core::Tensor a = core::Tensor::empty({cut}), b = core::Tensor::empty({p.numel - cut});
  t.init_host(i, a, 42, 0);
  t.init_host(i, b, 42, cut);
  auto av = a.to_vector(), bv = b.to_vector();
  av.insert(av.end(), bv.begin(), bv.end());
  EXPECT_EQ(av, w);
  for (int64_t e = 70 * 8; e < p.numel; ++e)
    EXPECT_EQ(w[e], 0.0f) << "padded element " << e;
  double sq = 0;
  for (int64_t e = 0; e < 70 * 8; ++e)
    sq += double(w[e]) * w[e];
  EXPECT_NEAR(std::sqrt(sq / (70 * 8)), 0.02, 0.003);
  // Different parameters get different streams.
  core::Tensor q = core::Tensor::empty(t.at("blocks.0.attn.qkv.weight").shape);
  t.init_host(*t.find("blocks.0.attn.qkv.weight"), q, 42);
  EXPECT_NE(q.to_vector()[0], w[0]);
}

TEST(ParamTable, RejectsBadConfig) {
  auto c = tiny(model::Arch::Modern);
  c.n_head = 3;
  EXPECT_THROW(model::ParamTable{c}, core::Error);
  c = tiny(model::Arch::Modern, 2);
  c.moe_top_k = 3;
  EXPECT_THROW(model::ParamTable{c}, core::Error);
}

// The recipe's parameters: names the optimizer globs can tell apart, their layers (the tables and
// the skip weights with the embedding, a block's scalars with the block), no attention weights in
// an MLP-only block, the vocabulary padded to vocab_pad.
TEST(ParamTable, RecipeParameters) {
  model::ModelConfig c;
  c.n_layer = 6;
  c.vocab_size = 200;
  c.vocab_pad = 128;
  c.no_attn_layers = {3};
  c.value_embeds = 2;
  c.unet_skips = true;
  c.x0_lambdas = true;
  c.zero_init_head = true;
  model::ParamTable t(c);
  EXPECT_EQ(t.at("embed.weight").shape, (core::Shape{256, c.d_model}));
  EXPECT_EQ(t.at("value_embeds.1.weight").shape, (core::Shape{256, c.d_model}));
  EXPECT_EQ(t.at("value_embeds.1.weight").kind, model::ParamKind::Embedding);
  EXPECT_EQ(t.at("value_embeds.1.weight").layer, -1);
  EXPECT_EQ(t.at("value_embeds.1.weight").valid_rows, 200);
  EXPECT_EQ(t.at("skip_weights").shape, (core::Shape{3}));
  EXPECT_EQ(t.at("skip_weights").layer, -1);
  EXPECT_EQ(t.at("blocks.4.lambdas").layer, 4);
  EXPECT_EQ(t.at("blocks.4.lambdas").kind, model::ParamKind::Vector);
  EXPECT_FALSE(t.find("blocks.3.attn.qkv.weight").has_value());
  EXPECT_FALSE(t.find("blocks.3.attn.proj.weight").has_value());
  EXPECT_TRUE(t.find("blocks.3.mlp.fc.weight").has_value());
  // Tables used by blocks 0, 1 and mirrored by 4, 5; the middle blocks mix none in.
  for (int l : {0, 1, 4, 5})
    EXPECT_TRUE(t.find("blocks." + std::to_string(l) + ".attn.v_lambdas").has_value()) << l;
  for (int l : {2, 3})
    EXPECT_FALSE(t.find("blocks." + std::to_string(l) + ".attn.v_lambdas").has_value()) << l;
  EXPECT_EQ(c.value_embed_of(4), 0);
  EXPECT_EQ(c.value_embed_of(5), 1);
  EXPECT_EQ(c.skip_source(3), 2);
  EXPECT_EQ(c.skip_source(5), 0);
  EXPECT_EQ(c.skip_source(2), -1);
  EXPECT_EQ(t.at("lm_head.weight").init, model::InitRule::Zero);
  // Bad values are refused naming the field.
  auto bad = c;
  bad.value_embeds = 4;
  EXPECT_THROW(model::ParamTable{bad}, core::Error);
  bad = c;
  bad.no_attn_layers = {6};
  EXPECT_THROW(model::ParamTable{bad}, core::Error);
  bad = c;
  bad.arch = model::Arch::Gpt2;
  EXPECT_THROW(model::ParamTable{bad}, core::Error);
}

}  // namespace
