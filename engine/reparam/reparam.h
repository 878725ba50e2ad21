// Reparam: a reparametrisation of trainables, a plug-in of the trainer (in the spirit of
// torchtitan's ModelConverter). It puts tensors of its own in place of some model parameters
// among the trainables (OSFT, engine/reparam/osft_reparam.h: a matrix's trained SVD factors),
// writes the model's parameters from them and maps the model's gradients back to them. The model
// stays dense and knows nothing of it; the optimizers step its tensors like any other trainable.
//
// The trainer holds the list make_reparams (engine/reparam/reparam_kinds.h, where the kinds are
// listed) builds from the config and calls the hooks in its phases; it never names a kind, and
// this interface knows none. In the order of a run:
//   replace_trainables  once, after the optimizer groups exist: the list the optimizers, the ZeRO
//                       state and the checkpoints see
//   init_from           train.init_from: the model's pretrained weights were set; derive its own
//   load                a checkpoint was read into the trainables: read its other tensors, write
//                       the model's parameters
//   on_layer_event      every layer event of the model (model::Gpt::LayerEvent): before a
//                       layer's forward or backward after the ZeRO state gathered the layer's
//                       trainables; after a layer's backward before the ZeRO state may start
//                       reducing their gradients (so a mapped gradient is reduced like any other)
//   after_step          after the optimizer step and the publish: the model's parameters from
//                       the updated trainables
//   save                a checkpoint: its tensors that are not trainables
// A kind's restrictions on the config (OSFT: no zero.stage 3) are its factory's: it refuses a run
// it cannot serve, naming the key.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/backend.h"
#include "core/tensor.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "engine/config.h"
#include "engine/trainable.h"
#include "model/gpt.h"
#include "optim/optimizer_set.h"

namespace engine {

class Reparam {
 public:
  virtual ~Reparam() = default;

  // The trainables with the model parameters it reparametrises replaced by its own tensors.
  virtual std::vector<Trainable> replace_trainables(std::vector<Trainable> trainables) = 0;
  // Whether trainable `name` is one of its tensors (train.init_from leaves those to init_from).
  virtual bool owns(const std::string& name) const = 0;

  // Pretrained whole weights of every model parameter (host tensors by name), already set where
  // they are trainables: derives its own tensors from those it reparametrises.
  virtual void init_from(const std::map<std::string, core::Tensor>& weights) = 0;
  // After a checkpoint's trainables were loaded and published.
  virtual void load(const CheckpointReader& reader) = 0;
  virtual void save(std::vector<SavedSlice>& slices, int rank) const = 0;

  virtual void on_layer_event(model::Gpt::LayerEvent event, int layer) = 0;
  virtual void after_step() = 0;
};

// What a reparametrisation is built from: the run's config, the model (its weights as
// initialised), the optimizer groups (which decide what is reparametrised, and which train its
// tensors) and the communicator of the model's tensors.
struct ReparamSetup {
  const Config& config;
  model::Gpt& gpt;
  optim::OptimizerSet& optimizers;
  comm::Communicator& tensors;
};

}  // namespace engine
