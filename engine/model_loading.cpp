#include "engine/model_loading.h"

#include <filesystem>

#include "core/check.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "engine/checkpoint/resume_check.h"
#include "engine/checkpoint/sharded_state.h"
#include "engine/reparam/reparam_kinds.h"
#include "model/hf_gpt2.h"
#include "model/weights_io.h"

namespace engine {

namespace fs = std::filesystem;

namespace {

std::map<std::string, core::Tensor> read_checkpoint_weights(const std::string& dir,
                                                            const model::ParamTable& table,
                                                            core::Backend& backend) {
  const CheckpointReader reader(dir);
  std::map<std::string, core::Tensor> out;
  for (const model::ParamInfo& p : table.params()) {
    const std::string key = param_key(p.name);
    if (!reader.has(key)) {
      core::Tensor dense = dense_weight_from_checkpoint(reader, p.name, p.shape, backend);
      ENGINE_CHECK(dense.defined(), "checkpoint " + dir + " has no parameter " + p.name);
      out[p.name] = std::move(dense);
      continue;
    }
    ENGINE_CHECK(reader.global_shape(key) == p.shape,
                 "checkpoint " + dir + ": parameter " + p.name + " has shape " +
                     core::shape_str(reader.global_shape(key)) + ", the model expects " +
                     core::shape_str(p.shape));
    out[p.name] = reader.read_full(key);
  }
  return out;
}

}  // namespace

model::ModelConfig model_config_of(const Config& c) {
  model::ModelConfig m;
  m.n_layer = static_cast<int>(c.model.n_layer);
  m.n_head = static_cast<int>(c.model.n_head);
  m.d_model = static_cast<int>(c.model.d_model);
  m.seq_len = static_cast<int>(c.model.seq_len);
  m.vocab_size = static_cast<int>(c.model.vocab_size);
  m.arch = model::parse_arch(c.model.arch);
  m.softcap = static_cast<float>(c.model.softcap);
  m.moe_experts = static_cast<int>(c.model.moe_experts);
  m.moe_top_k = static_cast<int>(c.model.moe_top_k);
  m.moe_aux_weight = static_cast<float>(c.model.moe_aux_weight);
  m.seed = static_cast<uint64_t>(c.train.seed);
  m.precision = model::parse_precision(c.train.precision);
  m.vocab_pad = static_cast<int>(c.model.vocab_pad);
  m.softcap_form = model::parse_softcap_form(c.model.softcap_form);
  m.softcap_scale = static_cast<float>(c.model.softcap_scale);
  m.softcap_offset = static_cast<float>(c.model.softcap_offset);
  m.attn_scale = static_cast<float>(c.model.attn_scale);
  m.no_attn_layers = parse_block_list(c.model.no_attn_layers).value_or(std::vector<int>{});
  m.value_embed_layers = parse_block_list(c.model.value_embed_layers).value_or(std::vector<int>{});
  m.value_embeds = m.value_embed_layers.empty() ? static_cast<int>(c.model.value_embeds)
                                                : static_cast<int>(m.value_embed_layers.size());
  m.unet_skips = c.model.unet_skips;
  m.x0_lambdas = c.model.x0_lambdas;
  m.zero_init_head = c.model.zero_init_head;
  m.doc_bos = static_cast<int>(c.model.doc_bos);
  m.window = static_cast<int>(c.model.window);
  m.window_pattern = c.model.window_pattern;
  m.window_grow = c.model.window_grow;
  m.window_block = static_cast<int>(c.model.window_block);
  m.x0_norm = c.model.x0_norm;
  m.norm_eps = static_cast<float>(c.model.norm_eps);
  m.rotary_base = static_cast<float>(c.model.rotary_base);
  m.rotary_truncate = c.model.rotary_truncate;
  m.v_lambdas_all = c.model.v_lambdas_all;
  m.loss_over_padding = c.model.loss_over_padding;
  m.embed_std = static_cast<float>(c.model.embed_std);
  m.uniform_matrix_init = c.model.uniform_matrix_init;
  m.head_fp8 = c.model.head_fp8;
  m.mlp_fp8 = c.model.mlp_fp8;
  m.head_fp8_x_scale = static_cast<float>(c.model.head_fp8_x_scale);
  m.head_fp8_w_scale = static_cast<float>(c.model.head_fp8_w_scale);
  m.head_fp8_grad_scale = static_cast<float>(c.model.head_fp8_grad_scale);
  m.key_offset = c.model.key_offset;
  m.bigram_rows = c.model.bigram_rows;
  m.smear = c.model.smear;
  m.sublayer_lambdas = c.model.sublayer_lambdas;
  m.qkvo_lambdas = c.model.qkvo_lambdas;
  m.mudd = c.model.mudd;
  m.yarn = c.model.yarn;
  m.xsa_layers = parse_block_list(c.model.xsa_layers).value_or(std::vector<int>{});
  m.attn_gate_layers = parse_block_list(c.model.attn_gate_layers).value_or(std::vector<int>{});
  m.paired_head_layers = parse_block_list(c.model.paired_head_layers).value_or(std::vector<int>{});
  m.validate();
  return m;
}

std::string weights_origin(const std::string& source) {
  return model::is_hf_gpt2_dir(source) ? model::hf_gpt2_weights_origin(source) : source;
}

std::map<std::string, core::Tensor> read_model_weights(const std::string& source,
                                                       const Config& config,
                                                       const model::ParamTable& table,
                                                       core::Backend& backend) {
  if (fs::exists(fs::path(source) / "manifest.yaml"))
    return read_checkpoint_weights(source, table, backend);
  if (model::is_hf_gpt2_dir(source)) return model::read_hf_gpt2(source, model_config_of(config));
  ENGINE_CHECK(fs::is_regular_file(source),
               "'" + source +
                   "' is neither a checkpoint folder (manifest.yaml), a Hugging Face GPT-2 "
                   "folder (config.json, model.safetensors) nor a safetensors file");
  return model::read_weights(source, table);
}

std::unique_ptr<model::Gpt> load_model(const Config& config, const std::string& source,
                                       core::Backend& backend) {
  if (fs::exists(fs::path(source) / "manifest.yaml"))
    check_same_model(source, read_manifest(source), config);
  auto gpt = std::make_unique<model::Gpt>(model_config_of(config), backend);
  model::set_weights(*gpt, read_model_weights(source, config, gpt->table(), backend));
  return gpt;
}

}  // namespace engine
