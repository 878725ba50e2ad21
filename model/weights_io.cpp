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
