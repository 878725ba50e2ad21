// Trainable: one tensor the optimizers train, as the trainer, the ZeRO state and the checkpoints
// see it. Today these are the model's parameters; a reparametrisation (OSFT) adds its own
// tensors to the list (its factors) and writes what the model reads through the model's
// bind_param before a layer's forward.
//
// `value` and `grad` are the full tensors while their owner keeps them resident (the model's
// flat buffers); at ZeRO stage 3 the owner frees them and the ZeRO state binds gathered full
// tensors for the time a layer is in use through bind_value / bind_grad (an undefined tensor
// unbinds).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "comm/placement.h"
#include "core/tensor.h"

namespace model {
class Gpt;
}  // namespace model

namespace engine {

struct Trainable {
  std::string name;  // checkpoint key and optimizer-glob name (docs/DESIGN.md parameter names)
  core::Shape shape;
  // The layer whose forward reads it and whose backward finishes its gradient (-1: used from
  // the start of forward to the end of backward: embeddings, final norm, head).
  int layer = -1;
  comm::Placement placement;  // as the optimizer requests it
  // The gradient is zero outside a few rows along dim 0 (an embedding: the rows of the tokens
  // seen), so reducing only the nonzero rows can move far fewer bytes.
  bool sparse_rows = false;
  core::Tensor value;  // full value (undefined when not resident)
  core::Tensor grad;   // full gradient, accumulated by the backward
  std::function<void(const core::Tensor&)> bind_value;
  std::function<void(const core::Tensor&)> bind_grad;
};

// The model's parameters as trainables, in parameter-table order (placements left Replicate:
// the trainer sets them from the optimizer groups). The bind functions point the model at
// full tensors; `gpt` must outlive them.
std::vector<Trainable> model_trainables(model::Gpt& gpt);

}  // namespace engine
