// Model loading: the model a config describes, and trained weights for it (parameters only) from
// a checkpoint folder, a safetensors file of `engine export` or a Hugging Face GPT-2 folder.
// `engine eval`, `export` and `sample` load their model here, without optimizers, a sharding
// plan or training data; train.init_from reads its weights here too.
//
// A checkpoint holds each model parameter as "param/<name>", or reparametrised as the tensors of
// the kind that saved it (an OSFT target as its factors): then that kind rebuilds the dense
// weight (engine/reparam/reparam.h), exactly as the trainer writes it into its model.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "core/backend.h"
#include "core/tensor.h"
#include "engine/config.h"
#include "model/gpt.h"

namespace engine {

// The engine config's model section as the model's own struct.
model::ModelConfig model_config_of(const Config& config);

// Where the weights of `source` are read from, for the log: a Hugging Face folder's weights
// file may be a link out of the folder (model::hf_gpt2_weights_origin).
std::string weights_origin(const std::string& source);

// Every parameter of `table`, whole, as host tensors by name, from `source` (any of the three
// kinds above; a reparametrised checkpoint's dense weights are computed on `backend`). A missing
// parameter or a shape other than the table's is refused, naming the source and the tensor.
std::map<std::string, core::Tensor> read_model_weights(const std::string& source,
                                                       const Config& config,
                                                       const model::ParamTable& table,
                                                       core::Backend& backend);

// The model of `config` on `backend` holding the weights of `source` (every rank reads them
// whole).
std::unique_ptr<model::Gpt> load_model(const Config& config, const std::string& source,
                                       core::Backend& backend);

}  // namespace engine
