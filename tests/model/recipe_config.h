// The record recipe's keys (docs/specs/modded_nanogpt.md c.1) on a 4-block test model, shared by
// the model tests and the parity test.
#pragma once

#include "model/model_config.h"

namespace test_model {

// Every key of the recipe on `c`: 4 blocks, block 2 MLP only, one value-embedding table (blocks 0
// and 3), U-net skips (block 2 adds block 1's output, block 3 block 0's), x0 lambdas, attention
// scale 0.12, the sigmoid logit cap 30 sigmoid(z / softcap_scale), a vocabulary padded to 128,
// documents starting at token doc_bos and sliding windows of 5 (long) and 2 (short: blocks 1
// and 2).
inline model::ModelConfig with_recipe_keys(model::ModelConfig c, float softcap_scale, int doc_bos) {
  c.n_layer = 4;
  c.no_attn_layers = {2};
  c.value_embeds = 1;
  c.unet_skips = true;
  c.x0_lambdas = true;
  c.attn_scale = 0.12f;
  c.softcap = 30.0f;
  c.softcap_form = model::SoftcapForm::Sigmoid;
  c.softcap_scale = softcap_scale;
  c.vocab_pad = 128;
  c.doc_bos = doc_bos;
  c.window = 5;
  c.window_pattern = "LSSL";
  return c;
}

// The record's exact forms (docs/record_recipe.md) on top of with_recipe_keys: x0 = rmsnorm of
// the embedding, RMSNorm eps FLT_EPSILON, the half-truncated rotary at base 1024 (head_dim / 4
// rotated pairs: head_dim >= 8), windows of `blocks` blocks of `block` tokens (short: blocks / 2,
// at least one), v scaled in every attention block, the loss over the padded logits, N(0, 1)
// tables and the uniform matrix init; head_fp8 as asked (a training-only path: eval_loss does
// not take it).
inline model::ModelConfig with_record_exact(model::ModelConfig c, int block, int blocks,
                                            bool head_fp8) {
  c.x0_norm = true;
  c.norm_eps = 1.1920928955078125e-07f;
  c.rotary_base = 1024.0f;
  c.rotary_truncate = true;
  c.window = block * blocks;
  c.window_block = block;
  c.v_lambdas_all = true;
  c.loss_over_padding = true;
  c.embed_std = 1.0f;
  c.uniform_matrix_init = true;
  c.head_fp8 = head_fp8;
  return c;
}

}  // namespace test_model
