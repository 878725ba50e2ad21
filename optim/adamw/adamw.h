// AdamW as modded-nanogpt's DistAdam (PR #102): elementwise, so it asks for Shard(0) and steps
// whatever rows of each parameter this rank holds; m and v exist only for those rows.
//
// Per parameter, with t its step counter and lr_p = lr * lr_scale * lr_mul:
//   W <- W (1 - lr_p wd wd_mul)                          decoupled decay, before the step
//   m <- b1 m + (1 - b1) g,   v <- b2 v + (1 - b2) g^2
//   eps_mode spec  (default): W <- W - lr_p sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)
//   eps_mode torch          : W <- W - lr_p (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
// The two agree when eps is negligible; with eps 1e-8 and gradients near 1e-7 they do not.
// weight_decay_mode cautious (the current record's Adam) replaces the decoupled decay: with u the
// Adam step above, u <- u + lr_p^2 wd wd_mul W where u W > 0, then W <- W - u.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "optim/hyper_reader.h"
#include "optim/optimizer.h"
#include "optim/state_slots.h"

namespace optim {

struct AdamWConfig {
  double lr = 0.008;
  double beta1 = 0.8;
  double beta2 = 0.95;
  double eps = 1e-10;
  double weight_decay = 0.0;
  double lr_mul = 1.0;
  double wd_mul = 1.0;
  bool torch_eps = false;    // eps_mode: spec | torch
  bool cautious_wd = false;  // weight_decay_mode: decoupled | cautious

  // Reads lr, betas, eps, weight_decay, weight_decay_mode, eps_mode, lr_mul, wd_mul (all
  // optional).
  static AdamWConfig from_yaml(HyperReader& reader);
};

class AdamW final : public Optimizer {
 public:
  explicit AdamW(const AdamWConfig& config);

  const char* kind() const override { return "adamw"; }
  double lr() const override { return config_.lr; }
  comm::Placement placement() const override { return comm::Placement::shard(0); }
  // The gradient scale rides in the fused update (no pass of its own over the gradients).
  bool folds_grad_scale() const override { return true; }
  void check_param(const std::string& name, const core::Shape& shape) const override;
  void step(std::span<const ParamShard> params, const StepContext& ctx) override;
  void save_state(OptimizerState& out) const override;
  void load_state(const OptimizerState& in) override;

  const AdamWConfig& config() const { return config_; }

 private:
  AdamWConfig config_;
  StateSlots slots_{"adamw", {"exp_avg", "exp_avg_sq"}, {"step"}};
};

}  // namespace optim
