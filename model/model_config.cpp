#include "model/model_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/check.h"

namespace model {

const char* arch_name(Arch arch) {
  return arch == Arch::Gpt2 ? "gpt2" : "modern";
}

Arch parse_arch(const std::string& name) {
  if (name == "gpt2") return Arch::Gpt2;
  if (name == "modern") return Arch::Modern;
  ENGINE_FAIL("model.arch: unknown architecture '" + name + "' (expected gpt2 or modern)");
}

const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::Fp32:
      return "fp32";
    case Precision::Tf32:
      return "tf32";
    case Precision::Bf16:
      return "bf16";
  }
  return "?";
}

Precision parse_precision(const std::string& name) {
  if (name == "fp32") return Precision::Fp32;
  if (name == "tf32") return Precision::Tf32;
  if (name == "bf16") return Precision::Bf16;
  ENGINE_FAIL("train.precision: unknown precision '" + name + "' (expected fp32, tf32 or bf16)");
}

const char* softcap_form_name(SoftcapForm form) {
  return form == SoftcapForm::Tanh ? "tanh" : "sigmoid";
}

SoftcapForm parse_softcap_form(const std::string& name) {
  if (name == "tanh") return SoftcapForm::Tanh;
  if (name == "sigmoid") return SoftcapForm::Sigmoid;
  ENGINE_FAIL("model.softcap_form: unknown form '" + name + "' (expected tanh or sigmoid)");
}

bool ModelConfig::has_attention(int layer) const {
  return std::find(no_attn_layers.begin(), no_attn_layers.end(), layer) == no_attn_layers.end();
}

int ModelConfig::value_embed_of(int layer) const {
  if (!value_embed_layers.empty()) {
    const auto at = std::find(value_embed_layers.begin(), value_embed_layers.end(), layer);
    return at == value_embed_layers.end() ? -1 : static_cast<int>(at - value_embed_layers.begin());
  }
  if (layer < value_embeds) return layer;
  if (layer >= n_layer - value_embeds) return layer - (n_layer - value_embeds);
  return -1;
}

int ModelConfig::skip_source(int layer) const {
  const int n = unet_count();
  return layer >= n_layer - n ? n_layer - 1 - layer : -1;
}

bool ModelConfig::short_window(int layer) const {
  return !window_pattern.empty() && window_pattern[static_cast<size_t>(layer)] == 'S';
}

namespace {

bool listed(const std::vector<int>& blocks, int layer) {
  return std::find(blocks.begin(), blocks.end(), layer) != blocks.end();
}

}  // namespace

bool ModelConfig::paired_heads(int layer) const {
  return listed(paired_head_layers, layer);
}

bool ModelConfig::xsa(int layer) const {
  return listed(xsa_layers, layer);
}

bool ModelConfig::attn_gate(int layer) const {
  return listed(attn_gate_layers, layer);
}

float ModelConfig::attention_scale() const {
  return attn_scale > 0.0f ? attn_scale : 1.0f / std::sqrt(static_cast<float>(head_dim()));
}

float ModelConfig::logit_gain() const {
  return softcap_form == SoftcapForm::Sigmoid ? softcap / (4.0f * softcap_scale) : 1.0f;
}

float ModelConfig::tanh_cap() const {
  return softcap_form == SoftcapForm::Sigmoid ? softcap / 2.0f : softcap;
}

void ModelConfig::validate() const {
  auto positive = [](int value, const char* key) {
    ENGINE_CHECK(value > 0,
                 std::string("model.") + key + " must be positive, got " + std::to_string(value));
  };
  positive(n_layer, "n_layer");
  positive(n_head, "n_head");
  positive(d_model, "d_model");
  positive(seq_len, "seq_len");
  positive(vocab_size, "vocab_size");
  ENGINE_CHECK(d_model % n_head == 0, "model.d_model (" + std::to_string(d_model) +
                                          ") must be a multiple of model.n_head (" +
                                          std::to_string(n_head) + ")");
  ENGINE_CHECK(
      head_dim() % 2 == 0 || arch != Arch::Modern,
      "model: rotary positions need an even head dimension, got " + std::to_string(head_dim()));
  ENGINE_CHECK(moe_experts >= 0, "model.moe.experts must be >= 0");
  ENGINE_CHECK(vocab_pad >= 1,
               "model.vocab_pad must be positive, got " + std::to_string(vocab_pad));
  if (softcap_form == SoftcapForm::Sigmoid) {
    ENGINE_CHECK(softcap > 0.0f, "model.softcap must be positive for the sigmoid soft-cap");
    ENGINE_CHECK(softcap_scale > 0.0f,
                 "model.softcap_scale must be positive for the sigmoid soft-cap");
  }
  ENGINE_CHECK(head_fp8_x_scale >= 0.0f && head_fp8_w_scale > 0.0f && head_fp8_grad_scale > 0.0f,
               "model.head_fp8_x_scale must be >= 0 (0: sqrt(d_model)), model.head_fp8_w_scale "
               "and model.head_fp8_grad_scale > 0");
  ENGINE_CHECK(head_fp8 || (head_fp8_x_scale == 0.0f && head_fp8_w_scale == 24.0f &&
                            head_fp8_grad_scale == 1.0f),
               "model.head_fp8_x_scale, head_fp8_w_scale and head_fp8_grad_scale need "
               "model.head_fp8");
  ENGINE_CHECK(softcap_offset == 0.0f || softcap_form == SoftcapForm::Sigmoid,
               "model.softcap_offset needs the sigmoid soft-cap (model.softcap_form sigmoid)");
  ENGINE_CHECK(softcap_offset == 0.0f || precision != Precision::Bf16 || head_fp8,
               "model.softcap_offset needs f32 logits: precision fp32 or tf32, or model.head_fp8");
  const ModelConfig off;
  const bool recipe =
      attn_scale > 0.0f || !no_attn_layers.empty() || value_embeds != 0 || unet_skips ||
      x0_lambdas || zero_init_head || softcap_form != SoftcapForm::Tanh || masked_attention() ||
      x0_norm || norm_eps != off.norm_eps || rotary_base != off.rotary_base || rotary_truncate ||
      v_lambdas_all || uniform_matrix_init || head_fp8 || mlp_fp8 || key_offset || mudd ||
      sublayer_lambdas || qkvo_lambdas || !paired_head_layers.empty() || yarn ||
      !xsa_layers.empty() || !attn_gate_layers.empty();
  ENGINE_CHECK(!recipe || arch == Arch::Modern,
               "model: the record recipe's keys (attn_scale, no_attn_layers, value_embeds, "
               "unet_skips, x0_lambdas, zero_init_head, softcap_form, doc_bos, window, x0_norm, "
               "norm_eps, rotary_base, rotary_truncate, v_lambdas_all, uniform_matrix_init, "
               "head_fp8, mlp_fp8, key_offset, mudd, sublayer_lambdas, qkvo_lambdas, "
               "paired_head_layers, yarn, xsa_layers, attn_gate_layers) need arch modern");
  ENGINE_CHECK(!mlp_fp8 || !moe(),
               "model.mlp_fp8 runs the dense MLP's GEMMs in FP8: it cannot go with model.moe");
  ENGINE_CHECK(!key_offset || (rotary_truncate && window > 0),
               "model.key_offset shifts the keys' unrotated half in the long-window blocks: it "
               "needs model.rotary_truncate and model.window");
  ENGINE_CHECK(bigram_rows == 0 || arch == Arch::Modern,
               "model.bigram_rows (the bigram hash embedding) needs arch modern");
  ENGINE_CHECK(bigram_rows == 0 || (bigram_rows >= 2 && bigram_rows - 1 <= INT32_MAX),
               "model.bigram_rows must be 0 (off) or in [2, 2^31] (the hash is an int32 mod rows - "
               "1), got " +
                   std::to_string(bigram_rows));
  ENGINE_CHECK(!smear || (arch == Arch::Modern && x0_norm && d_model >= kSmearGateWidth),
               "model.smear smears the embedding rows before x0's norm: it needs arch modern, "
               "model.x0_norm and d_model >= " +
                   std::to_string(kSmearGateWidth));
  ENGINE_CHECK(!mudd || (n_layer == kMuddBlocks && n_head == kMuddHeads),
               "model.mudd is record #89's fixed wiring of 11 blocks of 6 heads, got n_layer " +
                   std::to_string(n_layer) + ", n_head " + std::to_string(n_head));
  ENGINE_CHECK(
      !mudd || (sublayer_lambdas && no_attn_layers == std::vector<int>{kMuddSkipBlock} &&
                value_embeds == 0 && bigram_rows == 0 && !x0_lambdas && !unet_skips && !moe()),
      "model.mudd wires record #89's blocks: it needs model.sublayer_lambdas and "
      "no_attn_layers 6, and takes no value_embeds or bigram_rows (their gates are not "
      "wired to it yet), x0_lambdas, unet_skips or moe");
  ENGINE_CHECK(!sublayer_lambdas || !moe(),
               "model.sublayer_lambdas mixes a dense MLP's output alone: it cannot take "
               "model.moe");
  ENGINE_CHECK(!yarn || (window > 0 && !window_grow),
               "model.yarn rescales the rotary at each change of the long window: it needs "
               "model.window and the stages' windows (not model.window_grow)");
  for (const auto& [key, blocks] : {std::pair<const char*, const std::vector<int>*>{
                                        "model.paired_head_layers", &paired_head_layers},
                                    {"model.xsa_layers", &xsa_layers},
                                    {"model.attn_gate_layers", &attn_gate_layers}}) {
    for (int l : *blocks)
      ENGINE_CHECK(l >= 0 && l < n_layer && has_attention(l),
                   std::string(key) + ": block " + std::to_string(l) +
                       " is not an attention block of [0, n_layer=" + std::to_string(n_layer) +
                       ")");
  }
  for (int l : xsa_layers)
    ENGINE_CHECK(!paired_heads(l), "model.xsa_layers: block " + std::to_string(l) +
                                       " has paired heads; the record's XSA is for unpaired "
                                       "blocks only");
  ENGINE_CHECK(paired_head_layers.empty() || n_head % 2 == 0,
               "model.paired_head_layers pairs head h with h + n_head / 2: n_head must be even, "
               "got " +
                   std::to_string(n_head));
  ENGINE_CHECK(paired_head_layers.empty() || window_block == 0,
               "model.paired_head_layers: the record's paired blocks use a token-granular window "
               "on the interleaved sequence; model.window_block must be 0");
  ENGINE_CHECK(norm_eps > 0.0f, "model.norm_eps must be positive");
  ENGINE_CHECK(rotary_base > 1.0f, "model.rotary_base must be above 1");
  ENGINE_CHECK(!rotary_truncate || (head_dim() % 4 == 0 && head_dim() >= 8),
               "model.rotary_truncate needs a head dimension that is a multiple of 4 and at "
               "least 8 (head_dim / 4 >= 2 rotated pairs), got " +
                   std::to_string(head_dim()));
  ENGINE_CHECK(embed_std > 0.0f, "model.embed_std must be positive");
  ENGINE_CHECK(window_block >= 0, "model.window_block must be >= 0");
  ENGINE_CHECK(window_block == 0 || (window > 0 && window % window_block == 0),
               "model.window_block needs model.window, a multiple of it (window " +
                   std::to_string(window) + ", block " + std::to_string(window_block) + ")");
  ENGINE_CHECK(doc_bos >= -1 && doc_bos < vocab_size,
               "model.doc_bos must be -1 (off) or a token id below vocab_size");
  ENGINE_CHECK(window >= 0, "model.window must be >= 0");
  ENGINE_CHECK(
      window_pattern.empty() || (window > 0 && static_cast<int>(window_pattern.size()) == n_layer &&
                                 window_pattern.find_first_not_of("LS") == std::string::npos),
      "model.window_pattern must be empty or one L or S per block (with a window), got '" +
          window_pattern + "'");
  for (int l : no_attn_layers)
    ENGINE_CHECK(l >= 0 && l < n_layer, "model.no_attn_layers: block " + std::to_string(l) +
                                            " is outside [0, n_layer=" + std::to_string(n_layer) +
                                            ")");
  if (!value_embed_layers.empty()) {
    ENGINE_CHECK(value_embeds == static_cast<int>(value_embed_layers.size()),
                 "model.value_embed_layers names " + std::to_string(value_embed_layers.size()) +
                     " blocks but model.value_embeds is " + std::to_string(value_embeds) +
                     " (one table per named block)");
    for (size_t i = 0; i < value_embed_layers.size(); ++i) {
      const int l = value_embed_layers[i];
      ENGINE_CHECK(l >= 0 && l < n_layer && has_attention(l) &&
                       std::count(value_embed_layers.begin(), value_embed_layers.end(), l) == 1,
                   "model.value_embed_layers: block " + std::to_string(l) +
                       " must be an attention block in [0, n_layer) named once");
    }
  }
  ENGINE_CHECK(!value_embed_layers.empty() || (value_embeds >= 0 && 2 * value_embeds <= n_layer),
               "model.value_embeds must be in [0, n_layer / 2] (the first and the last blocks "
               "each use one table), got " +
                   std::to_string(value_embeds));
  if (moe()) {
    ENGINE_CHECK(moe_top_k >= 1 && moe_top_k <= moe_experts,
                 "model.moe.top_k must be in [1, experts=" + std::to_string(moe_experts) +
                     "], got " + std::to_string(moe_top_k));
    ENGINE_CHECK(moe_aux_weight >= 0.0f, "model.moe.aux_weight must be >= 0");
  }
}

}  // namespace model
