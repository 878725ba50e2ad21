// The FLOP rule against a count by hand of each matmul a token goes through.
#include "model/flops.h"

#include <gtest/gtest.h>

namespace {

model::ModelConfig shape(model::Arch arch, int experts = 0, int top_k = 2) {
  model::ModelConfig c;
  c.arch = arch;
  c.n_layer = 3;
  c.n_head = 2;
  c.d_model = 16;
  c.seq_len = 32;
  c.vocab_size = 100;  // padded to 128
  c.moe_experts = experts;
  c.moe_top_k = top_k;
  return c;
}

// Per layer: qkv 3 D^2, proj D^2, and the MLP's fc and proj 4 D^2 each; the head V_padded D.
constexpr double L = 3, D = 16, T = 32, Vp = 128, F = 4 * D;
constexpr double kAttention = 6 * L * D * T;

TEST(Flops, Gpt2CountsTheTiedEmbeddingAsTheHead) {
  const double weights = L * (3 * D * D + D * D + 2 * F * D) + Vp * D;
  EXPECT_DOUBLE_EQ(model::training_flops_per_token(shape(model::Arch::Gpt2)),
                   6 * weights + kAttention);
}

TEST(Flops, ModernCountsItsHeadNotItsEmbedding) {
  const double weights = L * (3 * D * D + D * D + 2 * F * D) + Vp * D;
  EXPECT_DOUBLE_EQ(model::training_flops_per_token(shape(model::Arch::Modern)),
                   6 * weights + kAttention);
}

// A token goes through the router and top_k of the E experts: 8 experts at top 2 cost what a
// dense MLP of 2 experts would, not 8.
TEST(Flops, MoeCountsTheRouterAndTopKExperts) {
  constexpr double E = 8, K = 2;
  const double weights = L * (3 * D * D + D * D + E * D + K * 2 * F * D) + Vp * D;
  EXPECT_DOUBLE_EQ(model::training_flops_per_token(shape(model::Arch::Modern, 8, 2)),
                   6 * weights + kAttention);
  EXPECT_DOUBLE_EQ(model::training_flops_per_token(shape(model::Arch::Gpt2, 8, 2)),
                   6 * weights + kAttention);
}

// The record recipe: an MLP-only block has no attention matrices and no attention term; value
// tables are lookups and the learned scalars vectors, neither counts.
TEST(Flops, RecipeCountsNoAttentionInMlpOnlyBlocksAndNoLookups) {
  auto c = shape(model::Arch::Modern);
  c.no_attn_layers = {1};
  c.value_embeds = 1;
  c.unet_skips = true;
  c.x0_lambdas = true;
  const double weights = (L - 1) * (3 * D * D + D * D) + L * 2 * F * D + Vp * D;
  EXPECT_DOUBLE_EQ(model::training_flops_per_token(c), 6 * weights + 6 * (L - 1) * D * T);
}

}  // namespace
