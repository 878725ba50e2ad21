// OsftReparam: the OSFT factors of the targeted model matrices, held beside the model
// (docs/specs/osft.md; docs/DESIGN.md "Trainables").
//
// The model stays dense and knows nothing of OSFT. Before a target's layer runs forward,
// write_dense(layer) writes W = U_high diag(S_high) V_high + U_low diag(S_low) V_low into the
// model's parameter (one [N, R] x [R, M] product, R = min(N, M)); after the layer's backward,
// map_grads(layer) maps the dense gradient dL/dW the model accumulated to the trained factors by
// the chain rule (optim::osft_factor_grads) and adds it to their gradients. Since the chain rule
// is linear, mapping each rank's unreduced dW and then reducing the factor gradients equals
// mapping the reduced dW.
//
// Targets are the 2-D model parameters whose optimizer group is `osft` with k_high > 0. Their
// factors rest full on every rank (what ZeRO stages 1 and 2 keep resident); each target's group
// optimizer gets the frozen rows this rank holds under `split`, and the trained factors
// "<name>.U_low|S_low|V_low" step in that group (OptimizerSet aliases).
//
// The factors live in the memory of the model's backend and every per-step product (write_dense,
// map_grads, the optimizer's projections) is a Backend operation; only the one-time SVDs
// (construction, redecompose) read the weights on the host. Checkpoints stage through the host
// (engine/sharded_state.h).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "engine/checkpoint.h"
#include "engine/trainable.h"
#include "model/gpt.h"
#include "optim/optimizer_set.h"
#include "optim/osft/osft.h"
#include "optim/osft/osft_factors.h"

namespace engine {

class OsftReparam {
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
  // As above when `groups` has an osft target, else null.
  static std::unique_ptr<OsftReparam> create_if_targeted(model::Gpt& gpt,
                                                         optim::OptimizerSet& groups,
                                                         comm::Communicator* comm,
                                                         comm::Communicator* shard_group,
                                                         optim::RowSplit split);

  // The trainables with every target's dense weight replaced by its trained factors (appended
  // in target order; the model's gradient of a target is mapped, not reduced).
  std::vector<Trainable> replace_trainables(std::vector<Trainable> model_trainables);

  // Decomposes every target again from the model's current weights (after pretrained weights
  // were written into the model), overwriting the factors in place; before the first step.
  void redecompose(comm::Communicator* comm);

  const std::vector<Target>& targets() const { return targets_; }
  std::vector<Factor>& factors() { return factors_; }
  const std::vector<Factor>& factors() const { return factors_; }
  bool is_target(const std::string& param) const;
  bool is_factor(const std::string& name) const;

  // Writes the dense weights of the targets of `layer` into the model (all layers: write_all).
  void write_dense(int layer);
  void write_all();
  // Adds the chain-rule gradients of the targets of `layer` from the model's dense gradients and
  // zeroes those (the next micro-step accumulates afresh). The trainer calls it right after the
  // layer's backward, before the ZeRO state may start reducing the factors.
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
  void map_target_grads(size_t i);

  model::Gpt& gpt_;
  core::Backend& backend_;               // the model's: it holds the factors
  std::unique_ptr<optim::OsftOps> ops_;  // their products, on the backend's device
  std::vector<Target> targets_;
  std::vector<Factor> factors_;  // six per target, in optim::kOsftFactorNames order
};

// Every model parameter of a checkpoint folder, whole, for train.init_from with OSFT targets
// (whose factors are computed from the dense weights); a missing parameter or a shape other than
// the model's is refused, naming the tensor.
std::map<std::string, core::Tensor> dense_checkpoint_weights(const std::string& dir,
                                                             const model::ParamTable& table);

}  // namespace engine
