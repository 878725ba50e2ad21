#include "model/hf_gpt2.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <vector>

#include "core/check.h"
#include "core/json.h"
#include "core/output_file.h"
#include "core/safetensors.h"
#include "core/transfer.h"

namespace model {

namespace {

namespace fs = std::filesystem;

// How one engine parameter appears in the Hugging Face file.
struct HfName {
  std::string hf;  // key without the "transformer." prefix
  bool transpose;  // a Conv1D weight: [in, out] there, [out, in] here
};

// The Hugging Face name of every parameter of the gpt2 arch's table.
HfName hf_name_of(const std::string& name) {
  static const std::vector<std::pair<std::string, std::string>> kBlockParts = {
      {"ln1.", "ln_1."},
      {"ln2.", "ln_2."},
      {"attn.qkv.", "attn.c_attn."},
      {"attn.proj.", "attn.c_proj."},
      {"mlp.fc.", "mlp.c_fc."},
      {"mlp.proj.", "mlp.c_proj."}};
  if (name == "embed.weight") return {"wte.weight", false};
  if (name == "pos_embed.weight") return {"wpe.weight", false};
  if (name.starts_with("ln_f.")) return {name, false};
  if (name.starts_with("blocks.")) {
    const size_t dot = name.find('.', 7);
    const std::string layer = name.substr(7, dot - 7);
    const std::string rest = name.substr(dot + 1);
    for (const auto& [engine_part, hf_part] : kBlockParts) {
      if (rest.starts_with(engine_part)) {
        const std::string leaf = rest.substr(engine_part.size());
        const bool matrix = leaf == "weight" && !engine_part.starts_with("ln");
        return {"h." + layer + "." + hf_part + leaf, matrix};
      }
    }
  }
  ENGINE_FAIL("hf_gpt2: parameter '" + name + "' has no Hugging Face GPT-2 counterpart");
}

core::Tensor transposed(const core::Tensor& t) {
  const int64_t rows = t.size(0), cols = t.size(1);
  core::Tensor out = core::Tensor::empty({cols, rows});
  const float* src = t.data<float>();
  float* dst = out.data<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      dst[c * rows + r] = src[r * cols + c];
  return out;
}

// GPT-2's config.json is under 1 kB; anything near this is no model config.
constexpr uintmax_t kMaxConfigJsonBytes = 1 << 20;

// A file of the folder must be a regular file: a FIFO blocked the open until a writer came and
// /dev/zero was read until memory ran out. A link is followed (see read_hf_gpt2).
void check_regular_file(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  ENGINE_CHECK(!ec, "hf_gpt2: cannot stat " + path + ": " + ec.message());
  if (status.type() == fs::file_type::regular) return;
  std::string what = "hf_gpt2: " + path + " is not a regular file";
  if (fs::is_symlink(path, ec)) what += " (a link to " + fs::read_symlink(path, ec).string() + ")";
  ENGINE_FAIL(what);
}

std::string read_text(const std::string& path) {
  check_regular_file(path);
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  ENGINE_CHECK(!ec && size <= kMaxConfigJsonBytes,
               "hf_gpt2: " + path + " is " + std::to_string(size) + " bytes, more than " +
                   std::to_string(kMaxConfigJsonBytes) + ": no model config");
  std::ifstream in(path, std::ios::binary);
  ENGINE_CHECK(in.good(), "hf_gpt2: cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string config_json(const ModelConfig& c) {
  // GPT-2's <|endoftext|> (50256) starts and ends its texts; a smaller vocabulary has no such
  // id, and a config naming one past the embedding would make generate() index out of range.
  const std::string end_of_text = c.vocab_size > 50256 ? "50256" : "null";
  std::ostringstream j;
  j << "{\n"
    << "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
    << "  \"model_type\": \"gpt2\",\n"
    << "  \"vocab_size\": " << c.vocab_size << ",\n"
    << "  \"n_positions\": " << c.seq_len << ",\n"
    << "  \"n_ctx\": " << c.seq_len << ",\n"
    << "  \"n_embd\": " << c.d_model << ",\n"
    << "  \"n_layer\": " << c.n_layer << ",\n"
    << "  \"n_head\": " << c.n_head << ",\n"
    << "  \"n_inner\": null,\n"
    << "  \"activation_function\": \"gelu_new\",\n"
    << "  \"layer_norm_epsilon\": 1e-05,\n"
    << "  \"initializer_range\": 0.02,\n"
    << "  \"resid_pdrop\": 0.0,\n"
    << "  \"embd_pdrop\": 0.0,\n"
    << "  \"attn_pdrop\": 0.0,\n"
    << "  \"scale_attn_weights\": true,\n"
    << "  \"tie_word_embeddings\": true,\n"
    << "  \"bos_token_id\": " << end_of_text << ",\n"
    << "  \"eos_token_id\": " << end_of_text << ",\n"
    << "  \"torch_dtype\": \"float32\"\n"
    << "}\n";
  return j.str();
}

// The attention-mask buffers that old GPT-2 files carry beside the weights (not parameters).
bool is_mask_buffer(const std::string& key) {
  return key.ends_with(".attn.bias") || key.ends_with(".attn.masked_bias");
}

// Every tensor of the file beyond the model's parameters would be dropped, and the model loaded
// would not be the file's: refused, naming them. An lm_head.weight is fine when it is wte (a tied
// head saved twice); one that differs is an untied head, which the gpt2 arch does not have.
void check_nothing_left(const core::SafetensorsReader& reader, const std::set<std::string>& used,
                        const core::Tensor& wte) {
  std::vector<std::string> extra;
  for (const core::StTensorInfo& info : reader.tensors()) {
    if (used.count(info.name) || is_mask_buffer(info.name)) continue;
    if (info.name == "lm_head.weight" || info.name == "transformer.lm_head.weight") {
      ENGINE_CHECK(info.shape == wte.shape(),
                   reader.path() + ": tensor '" + info.name + "' has shape " +
                       core::shape_str(info.shape) + ", not wte's " + core::shape_str(wte.shape()) +
                       ": an untied head, which the gpt2 arch (head tied to wte) cannot load");
      const core::Tensor head = reader.read_f32(info.name);  // as wte: F32, BF16 or F16
      const float* a = head.data<float>();
      const float* b = wte.data<float>();
      int64_t differ = 0;
      for (int64_t i = 0; i < head.numel(); ++i)
        differ += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
      ENGINE_CHECK(differ == 0, reader.path() + ": tensor '" + info.name +
                                    "' differs from wte in " + std::to_string(differ) + " of " +
                                    std::to_string(head.numel()) +
                                    " values: an untied head, which the gpt2 arch (head tied to "
                                    "wte) cannot load without changing the model");
      continue;
    }
    extra.push_back(info.name);
  }
  if (extra.empty()) return;
  std::string names;
  for (size_t i = 0; i < extra.size() && i < 5; ++i)
    names += (i ? ", '" : "'") + extra[i] + "'";
  if (extra.size() > 5) names += ", ...";
  ENGINE_FAIL(reader.path() + ": " + std::to_string(extra.size()) +
              " tensor(s) that are no parameter of this GPT-2 model (" + names +
              "): the model loaded would not be the file's (another architecture, or a config "
              "that does not match it)");
}

}  // namespace

std::string hf_gpt2_incompatibility(const ModelConfig& config) {
  // The record recipe's parameters, named (before the arch, whose refusal would hide them).
  if (config.value_embeds > 0)
    return "value embeddings (value_embeds.*.weight) have no place in GPT-2's network";
  if (config.unet_skips) return "U-net skips (skip_weights) have no place in GPT-2's network";
  if (config.x0_lambdas) return "x0 lambdas (blocks.*.lambdas) have no place in GPT-2's network";
  if (!config.no_attn_layers.empty())
    return "GPT-2 has attention in every block (model.no_attn_layers must be empty)";
  if (config.arch != Arch::Gpt2)
    return std::string("arch '") + arch_name(config.arch) +
           "' (rotary positions, RMSNorm, ReLU^2, untied head) is not GPT-2's network";
  if (config.moe()) return "a mixture-of-experts MLP has no place in GPT-2's network";
  if (config.softcap > 0) return "GPT-2 has no logit soft-cap (model.softcap must be 0)";
  return "";
}

void save_hf_gpt2(const Gpt& gpt, const std::string& dir) {
  const ModelConfig& c = gpt.config();
  const std::string why = hf_gpt2_incompatibility(c);
  ENGINE_CHECK(why.empty(),
               "export --format hf: this model has no Hugging Face GPT-2 "
               "counterpart: " +
                   why);
  core::SafetensorsWriter writer;
  writer.set_metadata("format", "pt");
  for (size_t i = 0; i < gpt.table().size(); ++i) {
    const ParamInfo& p = gpt.table()[i];
    core::Tensor host = core::to_host(gpt.backend(), gpt.param(i));
    if (p.valid_rows >= 0) host = host.slice(0, 0, p.valid_rows).clone();  // drop padding rows
    const HfName n = hf_name_of(p.name);
    writer.add("transformer." + n.hf, n.transpose ? transposed(host) : host);
  }
  fs::create_directories(dir);
  writer.write((fs::path(dir) / "model.safetensors").string());
  // Through an unpredictable temporary name, never through a link (core/output_file.h).
  core::write_output_file((fs::path(dir) / "config.json").string(), config_json(c),
                          "the exported config.json");
}

bool is_hf_gpt2_dir(const std::string& path) {
  return fs::is_directory(path) && fs::exists(fs::path(path) / "config.json") &&
         fs::exists(fs::path(path) / "model.safetensors");
}

std::string hf_gpt2_weights_origin(const std::string& dir) {
  const fs::path weights = fs::path(dir) / "model.safetensors";
  std::error_code ec;
  const fs::path target = fs::canonical(weights, ec);
  const fs::path folder = fs::canonical(dir, ec);
  if (ec || target.parent_path() == folder) return weights.string();
  return weights.string() + " (a link to " + target.string() + ", outside the folder)";
}

namespace {

// The keys of config.json that change GPT-2's network, against the one the engine computes
// (GELU in its tanh form, LayerNorm eps 1e-5, attention scaled by 1/sqrt(head dim) alone, the head
// tied to wte, an MLP 4x wide). An absent key takes transformers' default, which is the engine's;
// a value the engine cannot compute is refused naming the key, since the weights would load into
// another function. Dropout probabilities and the attention's upcast change no inference result.
void check_network_keys(const core::JsonValue& hf, const std::string& path,
                        const ModelConfig& config) {
  const auto refuse = [&](const std::string& key, const core::JsonValue& v,
                          const std::string& engine) {
    ENGINE_FAIL(path + ": " + key + " is " + v.describe() + ", but the engine's GPT-2 computes " +
                engine + ": the model loaded would not be the file's");
  };
  if (const core::JsonValue* v = hf.find("activation_function")) {
    const std::string act = v->is_string() ? v->text() : std::string();
    // transformers' gelu_new, gelu_pytorch_tanh and gelu_fast are one function, the tanh form.
    if (act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu_fast")
      refuse("activation_function", *v,
             "GELU in its tanh form (gelu_new, gelu_pytorch_tanh or gelu_fast)");
  }
  if (const core::JsonValue* v = hf.find("layer_norm_epsilon")) {
    const std::optional<double> eps = v->get_double();
    if (!eps || std::fabs(*eps - 1e-5) > 1e-5 * 1e-6) refuse("layer_norm_epsilon", *v, "1e-05");
  }
  if (const core::JsonValue* v = hf.find("scale_attn_weights"))
    if (!v->is_bool() || !v->boolean())
      refuse("scale_attn_weights", *v, "attention scaled by 1/sqrt(head dim) (true)");
  if (const core::JsonValue* v = hf.find("scale_attn_by_inverse_layer_idx"))
    if (!v->is_bool() || v->boolean())
      refuse("scale_attn_by_inverse_layer_idx", *v, "no scaling by the layer index (false)");
  if (const core::JsonValue* v = hf.find("tie_word_embeddings"))
    if (!v->is_bool() || !v->boolean())
      refuse("tie_word_embeddings", *v, "a head tied to wte (true)");
  if (const core::JsonValue* v = hf.find("n_inner"))
    if (!v->is_null() && v->get_int64() != std::optional<int64_t>(4 * int64_t{config.d_model}))
      refuse("n_inner", *v,
             "an MLP 4 x n_embd = " + std::to_string(4 * int64_t{config.d_model}) + " wide (null)");
}

}  // namespace

std::map<std::string, core::Tensor> read_hf_gpt2(const std::string& dir,
                                                 const ModelConfig& config) {
  const std::string why = hf_gpt2_incompatibility(config);
  ENGINE_CHECK(why.empty(), "hf_gpt2: " + dir +
                                " holds a Hugging Face GPT-2, but this model has "
                                "no counterpart: " +
                                why);
  const std::string config_path = (fs::path(dir) / "config.json").string();
  const core::JsonValue hf = core::parse_json(read_text(config_path), config_path);
  const auto field = [&](const char* key) -> const core::JsonValue& {
    const core::JsonValue* v = hf.find(key);
    ENGINE_CHECK(v != nullptr, config_path + " has no \"" + key + "\"");
    return *v;
  };
  ENGINE_CHECK(field("model_type").as_string(config_path + ": model_type") == "gpt2",
               config_path + ": model_type is '" + field("model_type").text() + "', not gpt2");
  const auto expect = [&](const char* key, int64_t want, const std::string& engine_key) {
    const int64_t got = field(key).as_int64(config_path + ": " + key);
    ENGINE_CHECK(got == want, config_path + ": " + key + " is " + std::to_string(got) +
                                  ", the model config has " + engine_key + " " +
                                  std::to_string(want));
  };
  expect("n_layer", config.n_layer, "model.n_layer");
  expect("n_head", config.n_head, "model.n_head");
  expect("n_embd", config.d_model, "model.d_model");
  expect("vocab_size", config.vocab_size, "model.vocab_size");
  const int64_t positions = field("n_positions").as_int64(config_path + ": n_positions");
  ENGINE_CHECK(positions >= config.seq_len,
               config_path + ": n_positions is " + std::to_string(positions) +
                   ", below the model config's model.seq_len " + std::to_string(config.seq_len));

  check_network_keys(hf, config_path, config);

  const std::string st_path = (fs::path(dir) / "model.safetensors").string();
  check_regular_file(st_path);
  core::SafetensorsReader reader(st_path);
  const auto key_of = [&](const std::string& hf) {
    return reader.contains("transformer." + hf) ? "transformer." + hf : hf;
  };
  const ParamTable table(config);
  std::map<std::string, core::Tensor> out;
  std::set<std::string> used;
  core::Tensor wte;  // as in the file, for comparing an lm_head.weight with it
  for (const ParamInfo& p : table.params()) {
    const HfName n = hf_name_of(p.name);
    const std::string key = key_of(n.hf);
    used.insert(key);
    ENGINE_CHECK(reader.contains(key),
                 st_path + ": tensor '" + key + "' (for " + p.name + ") is missing");
    const core::StTensorInfo& info = reader.info(key);
    // The shape the file must hold: padding rows and surplus positions are not in it.
    core::Shape want = p.shape;
    if (p.valid_rows >= 0) want[0] = p.valid_rows;
    if (p.name == "pos_embed.weight") want[0] = positions;
    if (n.transpose) std::swap(want[0], want[1]);
    ENGINE_CHECK(info.shape == want, st_path + ": tensor '" + key + "' has shape " +
                                         core::shape_str(info.shape) + ", the model (" + p.name +
                                         ") expects " + core::shape_str(want));
    core::Tensor t = reader.read_f32(key);  // a checkpoint stored in BF16 or F16 converts exactly
    if (p.name == "embed.weight") wte = t;
    if (n.transpose) t = transposed(t);
    if (p.valid_rows >= 0 || p.name == "pos_embed.weight") {
      core::Tensor full = core::Tensor::zeros(p.shape);
      const int64_t rows = std::min(t.size(0), p.shape[0]);
      full.slice(0, 0, rows).copy_from(t.slice(0, 0, rows));
      t = full;
    }
    out.emplace(p.name, t);
  }
  check_nothing_left(reader, used, wte);
  return out;
}

}  // namespace model
