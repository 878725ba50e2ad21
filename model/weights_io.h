// Model weights and gradients in safetensors files, under the parameter table's names and shapes.
// The model config travels in the file's metadata as model.* keys, so a reader (the PyTorch
// reference, export tools) can rebuild the model from the file alone.
#pragma once

#include <map>
#include <string>

#include "core/tensor.h"
#include "model/gpt.h"

namespace model {

// The config as safetensors metadata: model.arch, model.n_layer, ..., model.moe.experts.
std::map<std::string, std::string> config_metadata(const ModelConfig& config);

// Writes every parameter (F32, table shapes, table order) and the config metadata.
void save_weights(const Gpt& gpt, const std::string& path);

// Every parameter of `table` from a file written by save_weights (host F32 tensors by name).
// Refuses, with an error naming the file and the tensor, a file that lacks a parameter, holds a
// tensor the model does not have, or has a wrong shape or dtype.
std::map<std::string, core::Tensor> read_weights(const std::string& path, const ParamTable& table);

// Writes host weights (every parameter of the model's table by name, as read_weights returns
// them) into the model's parameters, which must be resident.
void set_weights(Gpt& gpt, const std::map<std::string, core::Tensor>& weights);

// Loads every parameter (read_weights, then set_weights). Refuses, with an error naming the file
// and the tensor, a file that lacks a parameter, holds a tensor the model does not have, or has a
// wrong shape or dtype.
void load_weights(Gpt& gpt, const std::string& path);

// Writes the scalar `loss` (the objective), `ce_loss` and `grad/<name>` for every parameter.
void save_gradients(const Gpt& gpt, const std::string& path, float loss, float ce_loss);

}  // namespace model
