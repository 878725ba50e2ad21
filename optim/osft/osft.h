// OSFT (orthogonal subspace fine-tuning, docs/specs/osft.md): AdamW on the trained SVD factors of
// the targeted matrices, kept orthogonal to the frozen top singular subspaces.
//
// A parameter group with `optimizer: osft` is a policy over its matrices: every 2-D parameter of
// the group whose k_high (OsftConfig::k_high_for) is positive is a target, replaced outside the
// model by its factors "<name>.U_high|S_high|V_high" (frozen) and "<name>.U_low|S_low|V_low"
// (trained); whoever holds the factors registers each target here with its frozen rows
// (add_target). Everything else of the group (vectors, embeddings, targets with k_high 0) trains
// dense with the same AdamW, as the reference does. A target stepped dense is refused, naming it.
//
// One step, after the caller has mapped dW to the factor gradients and clipped them (raw, before
// projection, spec section 7):
//   1. project_gradients: dU_low -= U_high (U_high^T dU_low); dV_low -= (dV_low V_high^T) V_high
//   2. adamw_step: torch.optim.AdamW on every part (decoupled decay, eps after sqrt(v)/sqrt(bc2))
//   3. project_parameters (project_params, default on): the same projection of U_low and V_low,
//      since AdamW's elementwise rescaling leaks into the frozen subspaces (reference issue #90).
// Factor parts are rows of each factor as the split of set_communicator says (the reference's
// torch.chunk counts by default); S_low is never projected. Every stage runs as Backend
// operations on tensors in the memory of the backend set_communicator names.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "optim/adamw/adamw.h"
#include "optim/hyper_reader.h"
#include "optim/optimizer.h"
#include "optim/osft/osft_projector.h"

namespace optim {

struct OsftConfig {
  double unfreeze_rank_ratio = 0.0;  // required: the fraction of singular directions that train
  std::vector<std::pair<std::string, int64_t>> k_high;  // glob -> k_high, first match wins
  AdamWConfig adamw;                                    // lr (required), betas, eps, weight_decay
  bool project_params = true;
  double v_high_cache_mb = 256;  // cache the gathered V_high when all targets' fit in this

  // Reads unfreeze_rank_ratio, lr (both required), k_high ({glob: k}), betas ([0.9, 0.95]),
  // eps (1e-8), weight_decay (0), project_params (true), v_high_cache_mb (256).
  static OsftConfig from_yaml(HyperReader& reader);
  // The frozen rank of a [rows, cols] matrix: the first matching k_high glob (0 <= k < min), else
  // osft_k_high(rows, cols, unfreeze_rank_ratio). 0: the matrix is not decomposed.
  int64_t k_high_for(const std::string& name, int64_t rows, int64_t cols) const;
};

class Osft final : public Optimizer {
 public:
  explicit Osft(const OsftConfig& config);

  const char* kind() const override { return "osft"; }
  double lr() const override { return config_.adamw.lr; }
  comm::Placement placement() const override { return comm::Placement::shard(0); }
  void check_param(const std::string& name, const core::Shape& shape) const override;
  // project_gradients, adamw_step and, when configured, project_parameters.
  void step(std::span<const ParamShard> params, const StepContext& ctx) override;
  void save_state(OptimizerState& out) const override;
  void load_state(const OptimizerState& in) override;

  const OsftConfig& config() const { return config_; }

  // The shard group the factors are split over (null: one process), how their rows are split
  // (null: osft_rows, torch.chunk counts) and the backend whose memory holds the factors and
  // runs the projections (every step must run on it); before add_target.
  void set_communicator(comm::Communicator* comm, RowSplit split, core::Backend& backend);
  // Registers a target (every rank, same order): its shape, k_high and this rank's rows of
  // U_high [N, k] and V_high [k, M], in the backend's memory.
  void add_target(const std::string& name, int64_t rows, int64_t cols, int64_t k_high,
                  core::Tensor U_high_rows, core::Tensor V_high_rows);

  // The three stages of step(). project_gradients returns the parts with projected copies of the
  // U_low and V_low gradients (the given gradients are left as they are).
  std::vector<ParamShard> project_gradients(std::span<const ParamShard> params);
  void adamw_step(std::span<const ParamShard> params, const StepContext& ctx);
  void project_parameters(std::span<const ParamShard> params);
  const OsftProjector& projector() const { return *projector_; }

 private:
  // Refuses a targeted matrix stepped dense (naming it).
  void check_not_dense_target(const ParamShard& p) const;
  // Runs one projection pass over the U_low / V_low parts found in `params` (values or grads).
  void project(std::span<const ParamShard> params, bool grads);

  OsftConfig config_;
  AdamW adamw_;
  comm::Communicator* comm_ = nullptr;
  RowSplit split_ = nullptr;
  core::Backend* backend_ = nullptr;  // set_communicator's
  std::unique_ptr<OsftProjector> projector_;
  std::set<std::string> targets_;
  std::vector<std::string> target_order_;
  struct Shape {
    int64_t rows, cols, k_high;
  };
  std::vector<Shape> shapes_;  // per target, in target_order_
};

}  // namespace optim
