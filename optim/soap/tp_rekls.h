// TpRekls (registry `tp_rekls`, spec section 3): REKLS for a parameter held as Shard(d) across
// its shard group (rows, d = 0, or columns, d = 1; ZeRO-style, this engine has no tensor-parallel
// model). Both Kronecker factors are sharded by rows, L [m/w, m] and R [n/w, n] per rank; the
// moments M, V are full and identical on every rank. Per step:
//   weight decay on the local part (l2: g += wd P before the gather, so L and R see it);
//   all-gather the gradient, L and R; eigh #1 of the gathered factors (what REKLS stored the
//   step before; identity bases before the first step, as REKLS starts); the REKLS update on the
//   full matrices (SoapUpdate); keep the local rows of L and R and the local part of the update.
// Every rank computes the same full update, so the result equals REKLS bit for bit (except with
// l2 decay). partition_dim: none keeps the parameter replicated: no collectives.
// distributed_eigh: true runs each eigendecomposition on one rank of the group (round robin)
// and broadcasts its basis and eigenvalues instead of every rank solving all of them.
// Every tensor lives in the step's backend; the shard group's communicator must move buffers of
// that backend's device (MPI for the CPU, NCCL for CUDA), which the step checks.
#pragma once

#include "optim/hyper_reader.h"
#include "optim/soap/soap.h"

namespace optim {

struct TpReklsConfig {
  SoapConfig soap;         // REKLS settings (weight decay is applied by TpRekls itself)
  int partition_dim = -1;  // 0 | 1 | -1 (none: replicated)
  bool distributed_eigh = false;

  // Reads lr (required), betas, shampoo_beta, eps, weight_decay, weight_decay_method,
  // fp32_matmul_prec, partition_dim (0 | 1 | none), distributed_eigh, batched_refresh.
  static TpReklsConfig from_yaml(HyperReader& reader);
};

class TpRekls final : public Optimizer {
 public:
  explicit TpRekls(const TpReklsConfig& config);

  const char* kind() const override { return "tp_rekls"; }
  double lr() const override { return config_.soap.lr; }
  comm::Placement placement() const override;
  void check_param(const std::string& name, const core::Shape& shape) const override;
  void step(std::span<const ParamShard> params, const StepContext& ctx) override;
  void save_state(OptimizerState& out) const override { slots_.save(out); }
  void load_state(const OptimizerState& in) override { slots_.load(in); }
  // M and V are whole [m, n] and identical on every rank (replicated); L and R are rows of
  // [m, m] and [n, n] (whole with partition_dim: none).
  std::optional<StateLayout> state_layout(const std::string& param, const std::string& slot,
                                          const core::Shape& full_shape, int rank,
                                          int world) const override;
  // From the next step on, adds where each step's time goes to `times` (null: off).
  void set_phase_times(SoapPhaseTimes* times) { times_ = times; }

 private:
  TpReklsConfig config_;
  SoapConfig update_config_;  // config_.soap without weight decay
  StateSlots slots_;
  SoapPhaseTimes* times_ = nullptr;
};

}  // namespace optim
