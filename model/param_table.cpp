#include "model/param_table.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/rng.h"

namespace model {

namespace {

// Record #89's MUDD bias inits, as stored: the effective values (after the 0.1 scale) divided by
// 0.1, in double and then rounded (the record's Python floats into a float32 tensor).
float pre_scale(double effective) {
  return static_cast<float>(effective / 0.1);
}

std::vector<float> mudd_gate_bias(int K) {
  std::vector<float> b(static_cast<size_t>(K), 0.0f);
  for (int i = 12; i < 18; ++i)
    b[static_cast<size_t>(i)] = pre_scale(0.25);  // the attention output gate (block 3 or 10)
  const int bigram_end = K == ModelConfig::kMuddGate0Coefs ? 26 : 28;
  for (int i = 19; i < bigram_end; i += 2)
    b[static_cast<size_t>(i)] = pre_scale(0.05);  // the bigram gates
  if (K == ModelConfig::kMuddGate1Coefs) {
    b[28] = pre_scale(0.5);  // the skip gate
    for (int i = 29; i < 35; ++i)
      b[static_cast<size_t>(i)] = pre_scale(1.0);  // DC w1 of block 10
  }
  return b;
}

std::vector<float> mudd_bias(int K) {
  std::vector<float> b(static_cast<size_t>(K), 0.0f);
  if (K == ModelConfig::kMudd1Coefs) {
    b[1] = pre_scale(-0.5);  // cache7's coefficient after the last block: the absorbed backout
    return b;
  }
  b[6] = b[7] = pre_scale(2.0);              // the value-embedding gate lanes
  b[8] = b[12] = pre_scale(std::sqrt(1.1));  // resid_attn, resid_mlp of the last block
  b[9] = b[13] = pre_scale(1.0);             // post_attn, post_mlp
  b[11] = pre_scale(0.05);                   // the bigram lambda
  return b;
}

}  // namespace

ParamTable::ParamTable(const ModelConfig& c) {
  c.validate();
  const int64_t D = c.d_model, F = c.d_ff(), Vp = c.padded_vocab(), E = c.moe_experts;
  const bool gpt2 = c.arch == Arch::Gpt2;
  constexpr float kStd = 0.02f;
  // GPT-2 scales the residual projections by 1/sqrt(2 L); modern zero-initialises them.
  const float proj_std = kStd / std::sqrt(2.0f * c.n_layer);
  const InitRule proj_init = gpt2 ? InitRule::Normal : InitRule::Zero;

  // The record's QKV and MLP fc weights: uniform with std 0.5 / sqrt(fan in).
  const InitRule in_init = c.uniform_matrix_init ? InitRule::Uniform : InitRule::Normal;
  const float in_std = c.uniform_matrix_init ? 0.5f / std::sqrt(static_cast<float>(D)) : kStd;

  add("embed.weight", {Vp, D}, ParamKind::Embedding, InitRule::Normal, c.embed_std, -1,
      c.vocab_size);
  // Record #89's coefficient MLPs (model/layers/coefficient_mlp.h): W1 [64, D] kaiming-uniform
  // (a = sqrt 5: U(+-1/sqrt D)), W2 [K, 64] zero, the bias with its fixed values.
  auto coefficient_mlp = [&](const std::string& prefix, std::vector<float> bias, int layer) {
    const int64_t K = static_cast<int64_t>(bias.size());
    add(prefix + ".w1", {64, D}, ParamKind::Matrix, InitRule::Uniform,
        1.0f / std::sqrt(3.0f * static_cast<float>(D)), layer);
    add(prefix + ".w2", {K, 64}, ParamKind::Matrix, InitRule::Zero, 0, layer);
    add_values(prefix + ".b2", std::move(bias), layer);
  };
  // The recipe's value embeddings and U-net skip weights serve several blocks: like the
  // embedding, they are used from the start of forward to the end of backward (layer -1).
  for (int i = 0; i < c.value_embeds; ++i)
    add("value_embeds." + std::to_string(i) + ".weight", {Vp, D}, ParamKind::Embedding,
        InitRule::Normal, c.embed_std, -1, c.vocab_size);
  if (c.unet_count() > 0)
    add_values("skip_weights", std::vector<float>(static_cast<size_t>(c.unet_count()), 1.0f), -1);
  // Record #89's input side: the bigram hash embedding (zero init) and the smear's gate and
  // lambda (zero), likewise used from the start of forward to the end of backward.
  if (c.bigram_rows > 0)
    add("bigram_embed.weight", {c.bigram_rows, D}, ParamKind::Embedding, InitRule::Zero, 0, -1);
  if (c.smear) {
    add_values("smear_gate", std::vector<float>(static_cast<size_t>(kSmearGateWidth), 0.0f), -1);
    add_values("smear_lambda", {0.0f}, -1);
  }
  if (gpt2)
    add("pos_embed.weight", {c.seq_len, D}, ParamKind::Embedding, InitRule::Normal, kStd, -1);
  if (c.mudd) {
    // Gate 0 runs on x0, before the blocks; the scale is shared with gate 1.
    add_values("mudd_gate.scale", {0.1f}, -1);
    coefficient_mlp("mudd_gate.0", mudd_gate_bias(ModelConfig::kMuddGate0Coefs), -1);
  }

  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blocks." + std::to_string(l) + ".";
    if (c.x0_lambdas) add_values(p + "lambdas", {1.0f, 0.0f}, l);  // block input l0 x + l1 x0
    // The block's bigram gate (block 0: at its start; later blocks: after their attention), the
    // record's gate bias 0.05.
    if (c.bigram_rows > 0 && (l == 0 || c.has_attention(l)))
      add_values(p + "bigram_gate", {0.05f}, l);
    if (c.sublayer_lambdas && !(c.mudd && l == c.n_layer - 1)) {
      // x = rho x + pi y after each sublayer (attention, MLP).
      const float rho = static_cast<float>(std::sqrt(1.1));
      add_values(p + "resid_lambdas", {rho, rho}, l);
      add_values(p + "post_lambdas", {1.0f, 1.0f}, l);
    }
    if (c.mudd && l == ModelConfig::kMuddSkipBlock)
      add_values("skip_lambda", {-1.5f}, l);  // the skip gate sigmoid(skip_lambda) g_skip
    if (c.mudd && l == ModelConfig::kMuddGate1Block)
      coefficient_mlp("mudd_gate.1", mudd_gate_bias(ModelConfig::kMuddGate1Coefs), l);
    if (c.mudd && l == c.n_layer - 1)
      coefficient_mlp("mudd.0", mudd_bias(ModelConfig::kMudd0Coefs), l);
    if (gpt2) {
      add(p + "ln1.weight", {D}, ParamKind::Vector, InitRule::One, 0, l);
      add(p + "ln1.bias", {D}, ParamKind::Vector, InitRule::Zero, 0, l);
    }
    if (c.has_attention(l)) {
      add(p + "attn.qkv.weight", {3 * D, D}, ParamKind::Matrix, in_init, in_std, l);
      if (gpt2) add(p + "attn.qkv.bias", {3 * D}, ParamKind::Vector, InitRule::Zero, 0, l);
      add(p + "attn.proj.weight", {D, D}, ParamKind::Matrix, proj_init, proj_std, l);
      if (gpt2) add(p + "attn.proj.bias", {D}, ParamKind::Vector, InitRule::Zero, 0, l);
      if (c.has_v_lambdas(l)) add_values(p + "attn.v_lambdas", {0.5f, 0.5f}, l);  // v mix
      if (c.qkvo_lambdas) add_values(p + "attn.qkvo_lambdas", {0.5f, 1.0f}, l);   // l_qkv, l_o
      const size_t H = static_cast<size_t>(c.n_head);
      if (c.xsa(l)) add_values(p + "attn.xsa_alpha", std::vector<float>(H, 0.0f), l);
      if (c.attn_gate(l)) add_values(p + "attn.out_gate", std::vector<float>(H, 1.0f), l);
    }
    if (gpt2) {
      add(p + "ln2.weight", {D}, ParamKind::Vector, InitRule::One, 0, l);
      add(p + "ln2.bias", {D}, ParamKind::Vector, InitRule::Zero, 0, l);
    }
    if (c.moe()) {
      add(p + "moe.router.weight", {E, D}, ParamKind::Matrix, InitRule::Normal, kStd, l);
      add(p + "moe.fc.weight", {E, F, D}, ParamKind::ExpertMatrix, InitRule::Normal, kStd, l);
      add(p + "moe.proj.weight", {E, D, F}, ParamKind::ExpertMatrix, proj_init, proj_std, l);
    } else {
      add(p + "mlp.fc.weight", {F, D}, ParamKind::Matrix, in_init, in_std, l);
      if (gpt2) add(p + "mlp.fc.bias", {F}, ParamKind::Vector, InitRule::Zero, 0, l);
      add(p + "mlp.proj.weight", {D, F}, ParamKind::Matrix, proj_init, proj_std, l);
      if (gpt2) add(p + "mlp.proj.bias", {D}, ParamKind::Vector, InitRule::Zero, 0, l);
    }
  }
  // The final norm and the untied head form layer n_layer: used after the last block, and the
  // first whose backward is done.
  const int head = c.n_layer;
  if (c.mudd) coefficient_mlp("mudd.1", mudd_bias(ModelConfig::kMudd1Coefs), head);
  if (gpt2) {
    add("ln_f.weight", {D}, ParamKind::Vector, InitRule::One, 0, head);
    add("ln_f.bias", {D}, ParamKind::Vector, InitRule::Zero, 0, head);
  } else {
    add("lm_head.weight", {Vp, D}, ParamKind::Head,
        c.zero_init_head ? InitRule::Zero : InitRule::Normal, kStd, head, c.vocab_size);
  }
}

void ParamTable::add(std::string name, core::Shape shape, ParamKind kind, InitRule init,
                     float stddev, int layer, int64_t valid_rows) {
  ParamInfo info;
  info.name = std::move(name);
  info.numel = core::shape_numel(shape);
  info.shape = std::move(shape);
  info.kind = kind;
  info.init = init;
  info.stddev = stddev;
  info.layer = layer;
  info.offset = total_numel_;
  info.valid_rows = valid_rows;
  total_numel_ += info.numel;
  params_.push_back(std::move(info));
}

void ParamTable::add_values(std::string name, std::vector<float> values, int layer) {
  const int64_t n = static_cast<int64_t>(values.size());
  add(std::move(name), {n}, ParamKind::Vector, InitRule::Values, 0, layer);
  params_.back().values = std::move(values);
}

std::optional<size_t> ParamTable::find(const std::string& name) const {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].name == name) return i;
  }
  return std::nullopt;
}

const ParamInfo& ParamTable::at(const std::string& name) const {
  auto i = find(name);
  ENGINE_CHECK(i.has_value(), "model has no parameter named '" + name + "'");
  return params_[*i];
}

void ParamTable::init_host(size_t i, const core::Tensor& dst, uint64_t seed, int64_t first) const {
  ENGINE_CHECK(i < params_.size(), "init_host: parameter index out of range");
  const ParamInfo& p = params_[i];
  ENGINE_CHECK(first >= 0 && first + dst.numel() <= p.numel,
               "init_host: range [" + std::to_string(first) + ", " +
                   std::to_string(first + dst.numel()) + ") outside " + p.name);
  switch (p.init) {
    case InitRule::Zero:
      dst.fill(0.0f);
      break;
    case InitRule::One:
      dst.fill(1.0f);
      break;
    case InitRule::Values:
      for (int64_t e = 0; e < dst.numel(); ++e)
        dst.data<float>()[e] = p.values[static_cast<size_t>(first + e)];
      break;
    case InitRule::Normal:
      core::fill_normal(dst, core::rng_hash(seed, i), 0.0f, p.stddev, static_cast<uint64_t>(first));
      break;
    case InitRule::Uniform: {
      const float bound = std::sqrt(3.0f) * p.stddev;
      core::fill_uniform(dst, core::rng_hash(seed, i), -bound, bound, static_cast<uint64_t>(first));
      break;
    }
  }
  if (p.valid_rows >= 0) {
    // Vocabulary padding rows start at element valid_rows * row_size and stay zero.
    const int64_t row = p.numel / p.shape[0];
    const int64_t pad_begin = p.valid_rows * row;
    float* d = dst.data<float>();
    for (int64_t e = std::max(pad_begin, first); e < first + dst.numel(); ++e)
      d[e - first] = 0.0f;
  }
}

}  // namespace model
