// OsftReparam: OSFT as a reparametrisation of the trainer (reparam.h; docs/specs/osft.md): the
// targeted model matrices train as their SVD factors, held beside the model.
//
// The model stays dense and knows nothing of OSFT. After every optimizer step (and a load or an
// init_from) write_all() writes W = U_high diag(S_high) V_high + U_low diag(S_low) V_low into
// the model's parameter (one [N, R] x [R, M] product, R = min(N, M)); after a layer's backward,
// map_grads(layer) maps the dense gradient dL/dW the model accumulated to the trained factors by
// the chain rule (optim::osft_factor_grads) and adds it to their gradients. Since the chain rule
// is linear, mapping each rank's unreduced dW and then reducing the factor gradients equals
// mapping the reduced dW.
//
// Targets are the 2-D model parameters whose optimizer group is `osft` with k_high > 0. Their
// factors rest full on every rank (what ZeRO stages 1 and 2 keep resident: stage 3 is refused);
// each target's group optimizer gets the frozen rows this rank holds under `split`, and the
// trained factors "<name>.U_low|S_low|V_low" step in that group (OptimizerSet aliases) as
// trainables. Checkpoints hold the trained factors as trainables and the frozen ones whole under
// "osft/<name>.U_high|S_high|V_high" (saved by rank 0).
//
// The factors live in the memory of the model's backend and every per-step product (write_all,
// map_grads, the optimizer's projections) runs through the OSFT ops on that device; only the
// one-time SVDs (construction, redecompose) read the weights on the host.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "engine/reparam/reparam.h"
#include "optim/osft/osft.h"
#include "optim/osft/osft_factors.h"

namespace engine {

class OsftReparam final : public Reparam {
 public:
  // One factor tensor: "<target>.<U_high|S_high|V_high|U_low|S_low|V_low>", full on every rank.
  struct Factor {
    std::string name;
    size_t target = 0;  // index into targets()
    int layer = -1;     // the target's layer (its forward reads W)
    bool trained = false;
    core::Tensor value;
    core::Tensor grad;  // trained factors only
  };
  struct Target {
    std::string name;  // the model parameter
    size_t param = 0;  // its index in the model's table
    int layer = -1;
    int64_t rows = 0, cols = 0, k_high = 0;
    optim::Osft* optimizer = nullptr;
  };

  // Finds the targets in `groups` (built over the model's parameters), decomposes them from the
  // model's current weights (float64 SVDs spread over comm), writes the reconstructed weights,
  // registers the trained factors as aliases of their target in `groups`, and gives each
  // target's Osft optimizer the shard group (the ranks the factor rows are split over; comm, or
  // null when every rank holds whole factors) and the frozen rows this rank holds by `split`.
  OsftReparam(model::Gpt& gpt, optim::OptimizerSet& groups, comm::Communicator* comm,
              comm::Communicator* shard_group, optim::RowSplit split);
  // The trainer's factory (listed in reparam_kinds.cpp): the factors of the setup's osft
  // targets, row-sharded like the plan splits them over the tensor communicator; null without
  // targets. A config with targets at zero.stage 3 is refused.
  static std::unique_ptr<Reparam> create(const ReparamSetup& setup);
  // The dense weight of target `param` from the factors a checkpoint holds (undefined when it
  // holds none for it); the shapes are checked against [shape], naming the tensor.
  static core::Tensor dense_from_checkpoint(const CheckpointReader& reader,
                                            const std::string& param, const core::Shape& shape,
                                            core::Backend& backend);

  // ---- Reparam --------------------------------------------------------------------------------
  // Every target's dense weight replaced by its trained factors (appended in target order; the
  // model's gradient of a target is mapped, not reduced).
  std::vector<Trainable> replace_trainables(std::vector<Trainable> model_trainables) override;
  bool owns(const std::string& name) const override;
  // The targets' pretrained weights into the model, then their fresh SVDs (redecompose).
  void init_from(const std::map<std::string, core::Tensor>& weights) override;
  // The frozen factors (load_frozen), then the dense weights from all of them.
  void load(const CheckpointReader& reader) override;
  void save(std::vector<SavedSlice>& slices, int rank) const override;
  // After a layer's backward: map_grads(layer).
  void on_layer_event(model::Gpt::LayerEvent event, int layer) override;
  // write_all(): the dense weights the model reads, from the new factors.
  void after_step() override;

  // ---- the factors ----------------------------------------------------------------------------
  // Decomposes every target again from the model's current weights (after pretrained weights
  // were written into the model), overwriting the factors in place; before the first step.
  void redecompose(comm::Communicator* comm);

  const std::vector<Target>& targets() const { return targets_; }
  std::vector<Factor>& factors() { return factors_; }
  const std::vector<Factor>& factors() const { return factors_; }
  bool is_target(const std::string& param) const;

  // Writes the dense weights of every target into the model.
  void write_all();
  // Adds the chain-rule gradients of the targets of `layer` from the model's dense gradients and
  // zeroes those (the next micro-step accumulates afresh).
  void map_grads(int layer);
  // Zeroes the trained factors' gradients.
  void zero_grads();

  // Checkpoints: the frozen factors, whole, saved by rank 0 under "osft/<target>.<factor>"; a
  // loaded checkpoint must hold every one with the expected shape (errors name the tensor).
  void save_frozen(std::vector<SavedSlice>& slices, int rank) const;
  void load_frozen(const CheckpointReader& reader);

  // The full factors of target i (views of the factor tensors).
  optim::OsftFactors full(size_t i) const;

 private:
  // The 2-D parameters of `gpt` that `groups` gives to an osft group with k_high > 0.
  static std::vector<Target> find_targets(const model::Gpt& gpt, optim::OptimizerSet& groups);
  void map_target_grads(size_t i);

  model::Gpt& gpt_;
  core::Backend& backend_;               // the model's: it holds the factors
  comm::Communicator* comm_;             // the SVDs are spread over it (null: one process)
  std::unique_ptr<optim::OsftOps> ops_;  // their products, on the backend's device
  std::vector<Target> targets_;
  std::vector<Factor> factors_;  // six per target, in optim::kOsftFactorNames order
};

}  // namespace engine
