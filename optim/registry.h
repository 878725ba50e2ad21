// Registry: optimizer name -> factory building it from a strict YAML map of hyperparameters.
//
// Built-in optimizers and their keys (defaults in parentheses); every group also has `params`
// and `optimizer`, and any other key is an error naming it and its line.
//   adamw    lr (0.008), betas ([0.8, 0.95]), eps (1e-10), weight_decay (0), lr_mul (1),
//            wd_mul (1), eps_mode (spec | torch), weight_decay_mode (decoupled | cautious)
//   muon     lr (0.05), momentum (0.95), nesterov (true), ns_steps (5), orthogonalizer
//            (ns5 | polar_express), weight_decay (0), weight_decay_mode (decoupled | cautious),
//            lr_mul (1), wd_mul (1), momentum_start (= momentum), momentum_warmup_steps (0),
//            momentum_end (= momentum_start), momentum_cooldown_steps (0), normalize (false),
//            beta2 (0.9), matrix_views ({"*.attn.qkv.weight": 3}; a map glob -> k | [k, r, c])
//   normuon  muon's keys with normalize true, orthogonalizer polar_express, cautious decay
//   osft     unfreeze_rank_ratio (required), lr (required), k_high ({glob: k}), betas
//            ([0.9, 0.95]), eps (1e-8), weight_decay (0), project_params (true),
//            v_high_cache_mb (256)
//   soap     lr (required), betas ([0.9, 0.95]), shampoo_beta (0.95), eps (1e-8), weight_decay
//            (0.01), weight_decay_method (decoupled | independent | l2 | palm), nesterov (false),
//            correct_bias (true), correct_shampoo_beta_bias (= correct_bias), fp32_matmul_prec
//            (highest), qr_fp32_matmul_prec (high), use_eigh (false), power_iter_steps (1),
//            max_update_rms (0), use_kl_shampoo (false), precondition_frequency (1),
//            adam_warmup_steps (0), use_adaptive_criteria (false), adaptive_update_tolerance
//            (1e-7), qr_sort (after | before), max_precond_dim (10000), precondition_1d (false),
//            adam_eps (corrected | raw), batched_refresh (true)               [optim/soap.h]
//   stacked_soap  soap's keys, use_kl_shampoo true by default; 3-D parameters
//   [optim/stacked_soap.h] rekls    lr, betas, shampoo_beta, eps, weight_decay,
//   weight_decay_method, max_precond_dim,
//            batched_refresh (the rest fixed: eigh every step, KL factors)   [optim/rekls.h]
//   tp_rekls rekls' keys plus fp32_matmul_prec (high), partition_dim (0 | 1 | none),
//            distributed_eigh (false)                                         [optim/tp_rekls.h]
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "optim/hyper_reader.h"
#include "optim/optimizer.h"

namespace optim {

// Reads its hyperparameters from the reader (every key it accepts); the registry then refuses
// whatever key was left unread.
using OptimizerFactory = std::function<std::unique_ptr<Optimizer>(HyperReader&)>;

class Registry {
 public:
  // The process-wide registry holding the built-in optimizers (adamw, muon, normuon, osft).
  static Registry& global();

  void add(const std::string& name, OptimizerFactory factory);
  bool contains(const std::string& name) const { return factories_.count(name) != 0; }
  std::vector<std::string> names() const;

  // Builds `name`; an unknown name lists the known ones, an unknown or mistyped
  // hyperparameter names the key and line (reader.context() says where).
  std::unique_ptr<Optimizer> create(const std::string& name, HyperReader& reader) const;

 private:
  std::map<std::string, OptimizerFactory> factories_;
};

}  // namespace optim
