// SOAP: Adam in the eigenbasis of Shampoo's Kronecker factors (docs/specs/soap_family.md).
// A whole-matrix rule, so it asks for Owned: the owner of a matrix keeps its factors and moments.
//
// Per matrix P [m, n] with gradient G, 0-based step counter t, k = t + 1 (spec section 1.2):
//   (1) L <- lerp(L, G G^T, 1 - bs), R <- lerp(R, G^T G, 1 - bs)   (KL-Shampoo: section 2)
//       bs = 1 - (1 - shampoo_beta) / (1 - shampoo_beta^k) when bias-corrected
//   (2) when t >= adam_warmup_steps and t % precondition_frequency == 0 (and, with the adaptive
//       criterion after the warm-up, unless every factor's basis still nearly diagonalises it):
//       M <- QL M QR^T; refresh (QL, lamL), (QR, lamR) by eigh (always at t == warm-up) or QR
//       power iteration; M <- QL^T M QR. V is never rotated (qr_sort after) or is permuted with
//       the pre-sorted basis (qr_sort before, the amortized reference).
//   (3) weight decay (decoupled, independent, palm: on P; l2: G += wd P, after the factors)
//   (4) Gp = QL^T G QR (G itself during warm-up); M, V Adam moments of Gp;
//       D = QL (M^ / (sqrt(V^) + eps)) QR^T, clipped to max_update_rms; P <- P - lr D.
// A side longer than max_precond_dim has no factor (identity); a 1-D parameter is a column with
// one factor when precondition_1d (plain Adam when its length exceeds max_precond_dim).
//
// A step runs in three phases over all its matrices: collect (factor updates, decisions, M
// rotated out), one batched refresh of every factor (RefreshBatch), apply (M rotated in, Adam,
// update). batched_refresh: false solves factor by factor instead; the numbers are the same.
// Every phase is backend operations, so the family steps on the CPU and the CUDA backend alike.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "optim/hyper_reader.h"
#include "optim/optimizer.h"
#include "optim/soap/eigenbasis.h"
#include "optim/soap/phase_times.h"
#include "optim/soap/soap_ops.h"
#include "optim/state_slots.h"

namespace optim {

enum class WeightDecayMethod { Decoupled, Independent, L2, Palm };

struct SoapConfig {
  double lr = 0.0;  // required
  double beta1 = 0.9;
  double beta2 = 0.95;
  double shampoo_beta = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.01;
  WeightDecayMethod weight_decay_method = WeightDecayMethod::Decoupled;
  bool nesterov = false;
  bool correct_bias = true;
  bool correct_shampoo_beta_bias = true;  // defaults to correct_bias
  // torch float32 matmul precisions of the reference (highest | high | medium). The CPU backend
  // always computes in full FP32, so on the CPU they do not change a number.
  std::string fp32_matmul_prec = "highest";
  std::string qr_fp32_matmul_prec = "high";
  bool use_eigh = false;
  int power_iter_steps = 1;
  double max_update_rms = 0.0;
  bool use_kl_shampoo = false;
  // Amortized refresh (spec section 5).
  int64_t precondition_frequency = 1;
  int64_t adam_warmup_steps = 0;
  bool use_adaptive_criteria = false;
  double adaptive_update_tolerance = 1e-7;
  bool qr_sort_before = false;  // qr_sort: after (current main) | before (amortized)
  // Dimension limits and 1-D parameters (spec section 6).
  int64_t max_precond_dim = 10000;
  bool precondition_1d = false;
  bool adam_eps_raw = false;  // adam_eps: corrected (eps after bias-correcting V) | raw (REF)
  bool batched_refresh = true;

  // Reads every key above (absent keys keep `defaults`); lr is required. Names the key on error.
  static SoapConfig from_yaml(HyperReader& reader, const SoapConfig& defaults);
  // The weight decay on P at learning rate lr, as P <- P + alpha P: alpha = -wd lr (decoupled),
  // -wd (independent), -wd lr^2 (palm); 0 for l2, which enters the gradient instead.
  double decay_alpha(double lr) const;
};

// One matrix being stepped: its data, gradient and state (null where a side has no factor), all
// in the memory of the backend that steps it. Side 0 is the left factor (rows, m), side 1 the
// right one (columns, n).
struct SoapMatrix {
  std::string name;
  int64_t m = 0, n = 0;
  float* param = nullptr;  // [m, n]
  core::Tensor grad;       // [m, n] working copy
  core::Tensor* exp_avg = nullptr;
  core::Tensor* exp_avg_sq = nullptr;
  core::Tensor* factor[2] = {nullptr, nullptr};
  core::Tensor* basis[2] = {nullptr, nullptr};
  core::Tensor* eigenvalues[2] = {nullptr, nullptr};
  int64_t* step = nullptr;
  // Set by the phases.
  bool refresh = false;
  // qr_sort before: each side's pre-sort permutation, for V (null where the side has none).
  std::unique_ptr<BackendIndices> sort_order[2];
  core::Tensor update;  // D [m, n]
};

// The SOAP update of a list of matrices, in the three phases. Shared by every optimizer of the
// family (TpRekls drives it on gathered full matrices).
class SoapUpdate {
 public:
  // `times` (may be null) gets where the step's time goes (phase_times.h).
  SoapUpdate(const SoapConfig& config, core::Backend& backend, SoapPhaseTimes* times = nullptr)
      : c_(config), backend_(backend), ops_(make_soap_ops(backend)), times_(times) {}

  SoapOps& ops() { return *ops_; }
  SoapPhaseTimes* phase_times() const { return times_; }

  // Factor updates (every statistic of the list as one gram_many), refresh decisions, M rotated
  // out, refreshes queued.
  void collect(std::span<SoapMatrix> xs, RefreshBatch& batch);
  // M rotated in, l2 decay, Adam in eigen coordinates: fills x.update and advances the counter.
  void finish(SoapMatrix& x);
  // P <- decayed P - lr D.
  void apply(SoapMatrix& x, double lr);
  // Every phase for a list of matrices.
  void run(std::vector<SoapMatrix>& xs, double lr);

 private:
  void update_factors(std::span<SoapMatrix> xs);          // (1)
  void plan_refresh(SoapMatrix& x, RefreshBatch& batch);  // (2)
  void rotate_out(const SoapMatrix& x, float* a);         // a <- QL a QR^T
  void rotate_in(const SoapMatrix& x, float* a);          // a <- QL^T a QR
  void rotate(const SoapMatrix& x, float* a, bool in);
  void permute_second_moment(SoapMatrix& x);  // V along each pre-sorted side
  bool meets_criterion(const SoapMatrix& x, int side);

  const SoapConfig& c_;
  core::Backend& backend_;
  std::unique_ptr<SoapOps> ops_;
  SoapPhaseTimes* times_;
};

// SOAP, and StackedSoap when stack_3d (3-D [b, m, n] parameters preconditioned as one 2-D
// matrix, stacked_soap.h).
class Soap final : public Optimizer {
 public:
  Soap(const SoapConfig& config, const char* kind, bool stack_3d = false);

  const char* kind() const override { return kind_; }
  double lr() const override { return config_.lr; }
  comm::Placement placement() const override { return comm::Placement::owned(); }
  void check_param(const std::string& name, const core::Shape& shape) const override;
  void step(std::span<const ParamShard> params, const StepContext& ctx) override;
  void save_state(OptimizerState& out) const override { slots_.save(out); }
  void load_state(const OptimizerState& in) override { slots_.load(in); }

  const SoapConfig& config() const { return config_; }
  // From the next step on, adds where each step's time goes to `times` (null: off).
  void set_phase_times(SoapPhaseTimes* times) { times_ = times; }

 private:
  // The matrix view of a parameter: [m, n] (1-D: [len, 1]; stacked 3-D: the stack).
  std::pair<int64_t, int64_t> matrix_shape(const core::Shape& shape) const;
  // The matrix [m, n] with its state slots (created on first use; a 1-D parameter is a column).
  SoapMatrix bind(const std::string& name, int64_t m, int64_t n, float* param, const float* grad,
                  bool one_d, core::Backend& backend);

  SoapConfig config_;
  const char* kind_;
  bool stack_3d_;
  StateSlots slots_;
  SoapPhaseTimes* times_ = nullptr;
};

}  // namespace optim
