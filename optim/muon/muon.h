// Muon as at modded-nanogpt PR #102: orthogonalised EMA momentum for hidden matrices. A
// whole-matrix rule, so it asks for Owned: each rank steps the whole tensors it owns.
//
// Per parameter seen as k independent [r, c] matrices (its matrix view; or several runs of them,
// each [k_i, r_i, c_i] with its own r_i / c_i below):
//   W <- W (1 - lr lr_scale wd wd_mul)                   decoupled decay, group lr, no lr_mul
//   B <- mu B + (1 - mu) G                               EMA momentum
//   U <- (1 - mu) G + mu B   (nesterov)   or   U <- B
//   O <- orthogonalise(U) per matrix                     NS5 (default) or Polar Express, float32
//   W <- W - lr lr_scale lr_mul sqrt(max(1, r / c)) O
// NorMuon (registry name "normuon": normalize, Polar Express and cautious decay by default) adds,
// after orthogonalising each [r, c] matrix V, a second-moment normalisation with state S (one
// value per row if r >= c, per column otherwise):
//   q = mean of V^2 along the other axis;  S <- beta2 S + (1 - beta2) q;  s = 1/sqrt(max(S, 1e-10))
//   V <- (V * s) ||V||_F / max(||V * s||_F, 1e-10)
// weight_decay_mode cautious replaces the decoupled decay: with lr_e = lr lr_scale lr_mul
// sqrt(max(1, r/c)) and wd_e = lr lr_scale wd wd_mul, W <- W - lr_e (wd_e [V W >= 0] W + V).
// Gradients arrive through the sharding layer, each owned matrix in its own buffer, so the
// shared receive buffer of the reference (spec a.3) has no counterpart here.
// mu follows an optional schedule: linear from momentum_start to momentum over the first
// momentum_warmup_steps, then back towards momentum_end over the last momentum_cooldown_steps.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "optim/hyper_reader.h"
#include "optim/muon/newton_schulz.h"
#include "optim/optimizer.h"
#include "optim/state_slots.h"

namespace optim {

// One run of equal matrices of a parameter: `count` matrices of [rows, cols] in row-major order.
// A parameter is cut into one or more runs, one after the other in memory.
struct MatrixView {
  int64_t count = 1;
  int64_t rows = 0;
  int64_t cols = 0;
};

// A view rule: parameters matching `glob` are split into `blocks` row blocks ([k*r, c] ->
// k x [r, c]), or, when `pieces` is given, viewed as those runs one after the other: [[k, r, c]]
// is exactly [k, r, c]; [[6, 256, 768], [1, 768, 768]] is record #89's QKV weight [3 D, D] with
// D = 768: Q and K orthogonalised per head pair (three [256, D] blocks each), V whole.
struct MatrixViewRule {
  std::string glob;
  int64_t blocks = 1;
  std::vector<MatrixView> pieces;  // empty: `blocks` equal row blocks
};

struct MuonConfig {
  double lr = 0.05;
  double momentum = 0.95;
  bool nesterov = true;
  int ns_steps = 5;
  std::string orthogonalizer = "ns5";  // ns5 | polar_express
  bool ns_tf32 = false;  // the orthogonaliser's GEMMs on TF32 tensor cores (CUDA; the CPU: f32)
  bool ns_bf16 = false;  // the orthogonaliser in bfloat16, op by op as modded-nanogpt runs it
  // ns_bf16_rounding: compiled (the record's torch.compile'd function: b A + (c A) A and
  // a X + B X each rounded once) or eager (each op rounded; NewtonSchulzSchedule::bf16_eager).
  bool ns_bf16_eager = false;
  double weight_decay = 0.0;
  double lr_mul = 1.0;
  double wd_mul = 1.0;
  double momentum_start = 0.95;  // defaults to `momentum`
  int64_t momentum_warmup_steps = 0;
  double momentum_end = 0.95;  // defaults to momentum_start
  int64_t momentum_cooldown_steps = 0;
  bool normalize = false;    // NorMuon second-moment normalisation
  double beta2 = 0.9;        // its EMA coefficient
  bool cautious_wd = false;  // weight_decay_mode: decoupled | cautious
  // Default: the merged QKV weight [3D, D] is three [D, D] matrices (modded-nanogpt's layout).
  std::vector<MatrixViewRule> matrix_views = {{"*.attn.qkv.weight", 3, {}}};

  // Reads lr, momentum, nesterov, ns_steps, orthogonalizer, ns_tf32, ns_bf16, ns_bf16_rounding,
  // weight_decay,
  // weight_decay_mode, lr_mul, wd_mul, momentum_start, momentum_warmup_steps, momentum_end,
  // momentum_cooldown_steps, normalize, beta2, matrix_views (all optional; absent keys keep the
  // values of `defaults`).
  static MuonConfig from_yaml(HyperReader& reader, const MuonConfig& defaults);
  // NorMuon's defaults (record #89): normalize, Polar Express, cautious decay.
  static MuonConfig normuon_defaults();
  // The momentum coefficient at 1-based `step` of a run of `total_steps` (0: unknown).
  double momentum_at(int64_t step, int64_t total_steps) const;
};

class Muon final : public Optimizer {
 public:
  explicit Muon(const MuonConfig& config, const char* kind = "muon");

  const char* kind() const override { return kind_; }
  double lr() const override { return config_.lr; }
  comm::Placement placement() const override { return comm::Placement::owned(); }
  void check_param(const std::string& name, const core::Shape& shape) const override;
  void step(std::span<const ParamShard> params, const StepContext& ctx) override;
  void save_state(OptimizerState& out) const override;
  void load_state(const OptimizerState& in) override;

  const MuonConfig& config() const { return config_; }
  // The matrices a parameter is orthogonalised as, runs in memory order (first matching view
  // rule, else leading dimensions as one run of [shape[-2], shape[-1]]).
  std::vector<MatrixView> view_of(const std::string& name, const core::Shape& shape) const;

 private:
  MuonConfig config_;
  const char* kind_;
  NewtonSchulzSchedule schedule_;
  StateSlots slots_;  // momentum_buffer and, for NorMuon, second_moment
};

}  // namespace optim
