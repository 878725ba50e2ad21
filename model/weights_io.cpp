#include "model/weights_io.h"

#include <set>
#include <sstream>

#include "core/check.h"
#include "core/safetensors.h"
#include "core/transfer.h"

namespace model {

namespace {

std::string float_str(float x) {
  std::ostringstream s;
  s.precision(9);
  s << x;
  return s.str();
}

}  // namespace

std::map<std::string, std::string> config_metadata(const ModelConfig& c) {
  std::map<std::string, std::string> m;
  m["model.arch"] = arch_name(c.arch);
  m["model.n_layer"] = std::to_string(c.n_layer);
  m["model.n_head"] = std::to_string(c.n_head);
  m["model.d_model"] = std::to_string(c.d_model);
  m["model.seq_len"] = std::to_string(c.seq_len);
  m["model.vocab_size"] = std::to_string(c.vocab_size);
  m["model.softcap"] = float_str(c.softcap);
  m["model.moe.experts"] = std::to_string(c.moe_experts);
  m["model.moe.top_k"] = std::to_string(c.moe_top_k);
  m["model.moe.aux_weight"] = float_str(c.moe_aux_weight);
  // The record recipe's keys, written only when set (files of other models keep their bytes).
  const ModelConfig off;
  if (c.vocab_pad != off.vocab_pad) m["model.vocab_pad"] = std::to_string(c.vocab_pad);
  if (c.softcap_form != off.softcap_form) {
    m["model.softcap_form"] = softcap_form_name(c.softcap_form);
    m["model.softcap_scale"] = float_str(c.softcap_scale);
    if (c.softcap_offset != 0.0f) m["model.softcap_offset"] = float_str(c.softcap_offset);
  }
  if (c.attn_scale > 0.0f) m["model.attn_scale"] = float_str(c.attn_scale);
  if (!c.no_attn_layers.empty()) {
    std::string list;
    for (int l : c.no_attn_layers) {
      if (!list.empty()) list += ',';
      list += std::to_string(l);
    }
    m["model.no_attn_layers"] = list;
  }
  if (c.value_embeds > 0) m["model.value_embeds"] = std::to_string(c.value_embeds);
  if (!c.value_embed_layers.empty()) {
    std::string list;
    for (int l : c.value_embed_layers)
      list += (list.empty() ? "" : ",") + std::to_string(l);
    m["model.value_embed_layers"] = list;
  }
  if (c.unet_skips) m["model.unet_skips"] = "true";
  if (c.x0_lambdas) m["model.x0_lambdas"] = "true";
  if (c.doc_bos >= 0) m["model.doc_bos"] = std::to_string(c.doc_bos);
  if (c.window > 0) {
    m["model.window"] = std::to_string(c.window);
    if (!c.window_pattern.empty()) m["model.window_pattern"] = c.window_pattern;
    if (c.window_block > 0) m["model.window_block"] = std::to_string(c.window_block);
  }
  // The record's exact forms (docs/record_recipe.md), likewise only when set.
  if (c.x0_norm) m["model.x0_norm"] = "true";
  if (c.key_offset) m["model.key_offset"] = "true";
  if (c.bigram_rows > 0) m["model.bigram_rows"] = std::to_string(c.bigram_rows);
  if (c.smear) m["model.smear"] = "true";
  if (c.sublayer_lambdas) m["model.sublayer_lambdas"] = "true";
  if (c.qkvo_lambdas) m["model.qkvo_lambdas"] = "true";
  if (c.mudd) m["model.mudd"] = "true";
  if (c.yarn) m["model.yarn"] = "true";
  for (const auto& [key, blocks] : {std::pair<const char*, const std::vector<int>*>{
                                        "model.paired_head_layers", &c.paired_head_layers},
                                    {"model.xsa_layers", &c.xsa_layers},
                                    {"model.attn_gate_layers", &c.attn_gate_layers}}) {
    if (blocks->empty()) continue;
    std::string list;
    for (int l : *blocks) {
      if (!list.empty()) list += ',';
      list += std::to_string(l);
    }
    m[key] = list;
  }
  if (c.norm_eps != off.norm_eps) m["model.norm_eps"] = float_str(c.norm_eps);
  if (c.rotary_base != off.rotary_base) m["model.rotary_base"] = float_str(c.rotary_base);
  if (c.rotary_truncate) m["model.rotary_truncate"] = "true";
  if (c.v_lambdas_all) m["model.v_lambdas_all"] = "true";
  if (c.loss_over_padding) m["model.loss_over_padding"] = "true";
  if (c.embed_std != off.embed_std) m["model.embed_std"] = float_str(c.embed_std);
  if (c.uniform_matrix_init) m["model.uniform_matrix_init"] = "true";
  if (c.head_fp8) m["model.head_fp8"] = "true";
  if (c.mlp_fp8) m["model.mlp_fp8"] = "true";
  if (c.head_fp8_x_scale != off.head_fp8_x_scale)
    m["model.head_fp8_x_scale"] = float_str(c.head_fp8_x_scale);
  if (c.head_fp8_w_scale != off.head_fp8_w_scale)
    m["model.head_fp8_w_scale"] = float_str(c.head_fp8_w_scale);
  if (c.head_fp8_grad_scale != off.head_fp8_grad_scale)
    m["model.head_fp8_grad_scale"] = float_str(c.head_fp8_grad_scale);
  return m;
}

void save_weights(const Gpt& gpt, const std::string& path) {
  core::SafetensorsWriter writer;
  for (const auto& [k, v] : config_metadata(gpt.config()))
    writer.set_metadata(k, v);
  for (size_t i = 0; i < gpt.table().size(); ++i) {
    writer.add(gpt.table()[i].name, core::to_host(gpt.backend(), gpt.param(i)));
  }
  writer.write(path);
}

std::map<std::string, core::Tensor> read_weights(const std::string& path, const ParamTable& table) {
  core::SafetensorsReader reader(path);
  for (const auto& info : reader.tensors()) {
    ENGINE_CHECK(table.find(info.name).has_value(),
                 path + ": tensor '" + info.name + "' is not a parameter of this model");
  }
  std::map<std::string, core::Tensor> out;
  for (const ParamInfo& p : table.params()) {
    ENGINE_CHECK(reader.contains(p.name), path + ": parameter '" + p.name + "' is missing");
    const core::StTensorInfo& info = reader.info(p.name);
    ENGINE_CHECK(info.shape == p.shape, path + ": parameter '" + p.name + "' has shape " +
                                            core::shape_str(info.shape) + ", expected " +
                                            core::shape_str(p.shape));
    out.emplace(p.name, reader.read_f32(p.name));  // BF16 and F16 files convert exactly
  }
  return out;
}

void set_weights(Gpt& gpt, const std::map<std::string, core::Tensor>& weights) {
  for (size_t i = 0; i < gpt.table().size(); ++i) {
    core::write_from_host(gpt.backend(), gpt.param(i), weights.at(gpt.table()[i].name));
  }
  gpt.params_updated();
}

void load_weights(Gpt& gpt, const std::string& path) {
  set_weights(gpt, read_weights(path, gpt.table()));
}

void save_gradients(const Gpt& gpt, const std::string& path, float loss, float ce_loss) {
  core::SafetensorsWriter writer;
  for (const auto& [k, v] : config_metadata(gpt.config()))
    writer.set_metadata(k, v);
  writer.add("loss", core::Tensor::from_vector({}, std::vector<float>{loss}));
  writer.add("ce_loss", core::Tensor::from_vector({}, std::vector<float>{ce_loss}));
  for (size_t i = 0; i < gpt.table().size(); ++i) {
    writer.add("grad/" + gpt.table()[i].name, core::to_host(gpt.backend(), gpt.grad(i)));
  }
  writer.write(path);
}

}  // namespace model
