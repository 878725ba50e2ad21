#include "model/param_table.h"

#include <cmath>

#include "core/check.h"
#include "core/rng.h"

namespace model {

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
  // The recipe's value embeddings and U-net skip weights serve several blocks: like the
  // embedding, they are used from the start of forward to the end of backward (layer -1).
  for (int i = 0; i < c.value_embeds; ++i)
    add("value_embeds." + std::to_string(i) + ".weight", {Vp, D}, ParamKind::Embedding,
        InitRule::Normal, c.embed_std, -1, c.vocab_size);
  if (c.unet_count() > 0)
    add_values("skip_weights", std::vector<float>(static_cast<size_t>(c.unet_count()), 1.0f), -1);
  if (gpt2)
    add("pos_embed.weight", {c.seq_len, D}, ParamKind::Embedding, InitRule::Normal, kStd, -1);
  for (int l = 0; l < c.n_layer; ++l) {
    const std::string p = "blocks." + std::to_string(l) + ".";
    if (c.x0_lambdas) add_values(p + "lambdas", {1.0f, 0.0f}, l);  // block input l0 x + l1 x0
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
