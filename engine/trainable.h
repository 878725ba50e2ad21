// Trainable: one tensor the optimizers train, as the trainer, the ZeRO state and the checkpoints
// see it. These are the model's parameters, except where a reparametrisation
// (engine/reparam/reparam.h) puts tensors of its own in their place (OSFT: a matrix's trained
// factors) and writes what the model reads from them.
//
// `value` and `grad` are the full tensors while their owner keeps them resident (the model's
// flat buffers); at ZeRO stage 3 the owner frees them and the ZeRO state binds gathered full
// tensors for the time a layer is in use through bind_value / bind_grad (an undefined tensor
// unbinds).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "comm/param_desc.h"
#include "core/tensor.h"

namespace model {
class Gpt;
}  // namespace model

namespace engine {

// A trainable is its descriptor (name, shape, placement, layer, sparse rows) plus the live
// full tensors.
struct Trainable : comm::ParamDesc {
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
