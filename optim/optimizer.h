// Optimizer: steps the local part of a set of parameters given their gradients and owns its state.
//
// The sharding layer decides where data lives; an optimizer only says which placement it needs:
// elementwise rules (AdamW) ask for Shard(0) and step whatever rows this rank holds, whole-matrix
// rules (Muon, SOAP, ...) ask for Owned and step the whole tensors this rank owns. Gradients
// arrive already averaged over ranks and already at that placement. State is kept per parameter
// name in declared slots (optim/state_slots.h) as tensors shaped like the local part, so a
// checkpoint stores it sharded like the parameters, or in a layout the optimizer states
// (state_layout).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>

#include "comm/communicator.h"
#include "comm/placement.h"
#include "core/backend.h"
#include "core/tensor.h"

namespace optim {

// The local part of one parameter this rank steps (a view of its descriptor's whole tensor,
// comm/param_desc.h): indices [begin, begin + value.size(dim)) along dimension `dim`, every
// other dimension whole; an Owned or Replicate parameter is whole (begin 0).
struct ParamShard {
  std::string name;        // parameter name (model/param_table.h), e.g. "blocks.0.attn.qkv.weight"
  core::Shape full_shape;  // shape of the whole parameter
  int64_t begin = 0;       // first index along `dim` held here
  core::Tensor value;      // this rank's part of the parameter
  core::Tensor grad;       // same shape as value, averaged over ranks
  int dim = 0;             // the split dimension (Shard(dim))
};

struct StepContext {
  int64_t step = 1;                    // 1-based index of the step being taken
  int64_t total_steps = 0;             // length of the run (momentum cool-down); 0 when unknown
  double lr_scale = 1.0;               // the learning-rate schedule's multiplier at this step
  core::Backend* backend = nullptr;    // where value/grad live (required: backend_of)
  comm::Communicator* comm = nullptr;  // the shard group (optimizers that gather, e.g. tp_rekls)
  // The factor the gradients are to be multiplied by (their mean over ranks and micro-steps and
  // the clip), a float on the backend's device, for an optimizer whose folds_grad_scale() is
  // true; the others get gradients already scaled. nullptr: 1.
  const float* grad_scale = nullptr;
};

// Optimizer state by key "<param>/<slot>" (tensors) and "<param>/<counter>" (integers).
struct OptimizerState {
  std::map<std::string, core::Tensor> tensors;
  std::map<std::string, int64_t> counters;
};

// Where a rank's state tensor lies in the tensor a checkpoint stores: indices [begin, begin +
// size) of dimension `dim` of `global_shape`, every other dimension whole. A replicated one is
// the whole tensor, identical on every rank: rank 0 saves it and every rank reads it whole.
struct StateLayout {
  core::Shape global_shape;
  int dim = 0;
  int64_t begin = 0;
  int64_t size = 0;
  bool replicated = false;

  static StateLayout whole(core::Shape shape);
  // Rank `rank`'s equal part of `shape` along `dim` (shape[dim] divided by `world`).
  static StateLayout part(core::Shape shape, int dim, int rank, int world);
  // The shape of the tensor a rank holds.
  core::Shape local_shape() const;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  virtual const char* kind() const = 0;  // registry name: "adamw", "muon"
  // The step size in effect before the schedule's scale and lr_mul: the config's lr, or the
  // optimizer's default where the config gives none (what the trainer logs).
  virtual double lr() const = 0;
  // Placement requested for every parameter of this optimizer: Shard(0) or Owned(auto).
  virtual comm::Placement placement() const = 0;
  // Whether step() multiplies each gradient by *StepContext::grad_scale itself (inside a fused
  // update, saving the trainer's pass over these gradients); false: they arrive scaled.
  virtual bool folds_grad_scale() const { return false; }
  // Refuses a parameter this optimizer cannot step (e.g. Muon and a vector), naming it.
  virtual void check_param(const std::string& name, const core::Shape& shape) const = 0;

  // Steps every given local part in place. State for a parameter not seen before starts at zero.
  virtual void step(std::span<const ParamShard> params, const StepContext& ctx) = 0;

  // Adds this optimizer's state to `out`; replaces it from `in`, which holds only keys of this
  // optimizer's parameters (OptimizerSet filters them); an unknown slot is an error.
  virtual void save_state(OptimizerState& out) const = 0;
  virtual void load_state(const OptimizerState& in) = 0;

  // The layout of state tensor `slot` of parameter `param` (whole shape `full_shape`) on rank
  // `rank` of `world`, when the optimizer keeps it in its own layout; nullopt (the default)
  // means shaped like the parameter's local part, or whole for an Owned/Replicate parameter.
  virtual std::optional<StateLayout> state_layout(const std::string& /*param*/,
                                                  const std::string& /*slot*/,
                                                  const core::Shape& /*full_shape*/, int /*rank*/,
                                                  int /*world*/) const {
    return std::nullopt;
  }
};

// Helpers shared by the optimizers.
core::Backend& backend_of(const StepContext& ctx);
// Checks that value and grad are defined, contiguous f32 with equal shapes; errors name `who`.
void check_shard(const ParamShard& p, const char* who);

}  // namespace optim
