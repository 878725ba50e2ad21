#include "optim/soap/soap.h"

#include <array>
#include <cmath>
#include <optional>

#include "core/check.h"
#include "optim/soap/stacked_soap.h"

namespace optim {

namespace {

// The state slots of a SOAP matrix (a side without a factor has none of its three).
const std::vector<std::string> kSoapTensorSlots = {
    "exp_avg",    "exp_avg_sq",  "factor_left",      "factor_right",
    "basis_left", "basis_right", "eigenvalues_left", "eigenvalues_right",
};

const char* const kFactorSlot[2] = {"factor_left", "factor_right"};
const char* const kBasisSlot[2] = {"basis_left", "basis_right"};
const char* const kEigenvalueSlot[2] = {"eigenvalues_left", "eigenvalues_right"};

void check_choice(HyperReader& r, const char* key, const std::string& value,
                  std::initializer_list<const char*> allowed) {
  std::string list;
  for (const char* a : allowed) {
    if (value == a) return;
    list += (list.empty() ? "" : ", ") + std::string(a);
  }
  r.fail(key, "must be one of " + list + ", got '" + value + "'");
}

}  // namespace

SoapConfig SoapConfig::from_yaml(HyperReader& r, const SoapConfig& d) {
  SoapConfig c = d;
  if (!r.has("lr")) r.fail("", "missing 'lr' (the SOAP family has no default step size)");
  c.lr = r.number("lr", c.lr);
  const std::vector<double> betas = r.numbers("betas", {c.beta1, c.beta2});
  if (betas.size() != 2) r.fail("betas", "must be a list of two numbers [beta1, beta2]");
  c.beta1 = betas[0];
  c.beta2 = betas[1];
  c.shampoo_beta = r.number("shampoo_beta", c.shampoo_beta);
  c.eps = r.number("eps", c.eps);
  c.weight_decay = r.number("weight_decay", c.weight_decay);
  const std::string wd = r.string("weight_decay_method", [&] {
    switch (c.weight_decay_method) {
      case WeightDecayMethod::Independent:
        return "independent";
      case WeightDecayMethod::L2:
        return "l2";
      case WeightDecayMethod::Palm:
        return "palm";
      default:
        return "decoupled";
    }
  }());
  check_choice(r, "weight_decay_method", wd, {"decoupled", "independent", "l2", "palm"});
  c.weight_decay_method = wd == "independent" ? WeightDecayMethod::Independent
                          : wd == "l2"        ? WeightDecayMethod::L2
                          : wd == "palm"      ? WeightDecayMethod::Palm
                                              : WeightDecayMethod::Decoupled;
  c.nesterov = r.boolean("nesterov", c.nesterov);
  c.correct_bias = r.boolean("correct_bias", c.correct_bias);
  c.correct_shampoo_beta_bias = r.boolean("correct_shampoo_beta_bias", c.correct_bias);
  c.fp32_matmul_prec = r.string("fp32_matmul_prec", c.fp32_matmul_prec);
  check_choice(r, "fp32_matmul_prec", c.fp32_matmul_prec, {"highest", "high", "medium"});
  c.qr_fp32_matmul_prec = r.string("qr_fp32_matmul_prec", c.qr_fp32_matmul_prec);
  check_choice(r, "qr_fp32_matmul_prec", c.qr_fp32_matmul_prec, {"highest", "high", "medium"});
  c.use_eigh = r.boolean("use_eigh", c.use_eigh);
  c.power_iter_steps = static_cast<int>(r.integer("power_iter_steps", c.power_iter_steps));
  c.max_update_rms = r.number("max_update_rms", c.max_update_rms);
  c.use_kl_shampoo = r.boolean("use_kl_shampoo", c.use_kl_shampoo);
  c.precondition_frequency = r.integer("precondition_frequency", c.precondition_frequency);
  c.adam_warmup_steps = r.integer("adam_warmup_steps", c.adam_warmup_steps);
  c.use_adaptive_criteria = r.boolean("use_adaptive_criteria", c.use_adaptive_criteria);
  c.adaptive_update_tolerance = r.number("adaptive_update_tolerance", c.adaptive_update_tolerance);
  const std::string sort = r.string("qr_sort", c.qr_sort_before ? "before" : "after");
  check_choice(r, "qr_sort", sort, {"after", "before"});
  c.qr_sort_before = sort == "before";
  c.max_precond_dim = r.integer("max_precond_dim", c.max_precond_dim);
  c.precondition_1d = r.boolean("precondition_1d", c.precondition_1d);
  const std::string adam_eps = r.string("adam_eps", c.adam_eps_raw ? "raw" : "corrected");
  check_choice(r, "adam_eps", adam_eps, {"corrected", "raw"});
  c.adam_eps_raw = adam_eps == "raw";
  c.batched_refresh = r.boolean("batched_refresh", c.batched_refresh);

  if (!(c.lr >= 0)) r.fail("lr", "must be >= 0");
  if (!(c.beta1 >= 0 && c.beta1 < 1)) r.fail("betas", "beta1 must be in [0, 1)");
  if (!(c.beta2 >= 0 && c.beta2 < 1)) r.fail("betas", "beta2 must be in [0, 1)");
  if (!(c.shampoo_beta >= 0 && c.shampoo_beta < 1)) r.fail("shampoo_beta", "must be in [0, 1)");
  if (!(c.eps > 0)) r.fail("eps", "must be > 0");
  if (!(c.weight_decay >= 0)) r.fail("weight_decay", "must be >= 0");
  if (c.power_iter_steps < 1) r.fail("power_iter_steps", "must be >= 1");
  if (!(c.max_update_rms >= 0)) r.fail("max_update_rms", "must be >= 0 (0 = no clipping)");
  if (c.precondition_frequency < 1) r.fail("precondition_frequency", "must be >= 1");
  if (c.adam_warmup_steps < 0) r.fail("adam_warmup_steps", "must be >= 0");
  if (!(c.adaptive_update_tolerance >= 0)) r.fail("adaptive_update_tolerance", "must be >= 0");
  if (c.max_precond_dim < 1) r.fail("max_precond_dim", "must be >= 1");
  return c;
}

// ---- the update ---------------------------------------------------------------------------------
//
// Every array below is in the backend's memory and every loop is a device op (the Backend's gemm,
// column ops and eigh_many / qr_many, and the family's own SoapOps), so a step runs on either
// backend. The one read back to the host is the adaptive criterion's (meets_criterion), whose
// outcome decides whether a refresh runs.

// a <- QL a QR^T (rotate_in: QL^T a QR) through one scratch matrix, a side without a basis
// skipped.
void SoapUpdate::rotate_out(const SoapMatrix& x, float* a) {
  rotate(x, a, false);
}

void SoapUpdate::rotate_in(const SoapMatrix& x, float* a) {
  rotate(x, a, true);
}

void SoapUpdate::rotate(const SoapMatrix& x, float* a, bool in) {
  const int64_t m = x.m, n = x.n;
  const float* left = x.basis[0] ? x.basis[0]->data<float>() : nullptr;
  const float* right = x.basis[1] ? x.basis[1]->data<float>() : nullptr;
  if (!left && !right) return;
  core::Tensor tmp = backend_tensor(backend_, {m, n});
  float* t = tmp.data<float>();
  if (left) matmul(backend_, left, in, a, false, t, m, n, m);
  if (right) matmul(backend_, left ? t : a, false, right, !in, left ? a : t, m, n, n);
  if (!left || !right) backend_.copy(a, t, tmp.nbytes());
}

// Met when tol ||K||_F >= ||K||_F - ||diag(Q^T K Q)||_2: the basis nearly diagonalises K. The
// two squared norms are read back to the host: whether to refresh is a data-dependent branch.
bool SoapUpdate::meets_criterion(const SoapMatrix& x, int side) {
  const core::Tensor& k = *x.factor[side];
  const int64_t d = k.size(0);
  core::Tensor lam = backend_tensor(backend_, {d});
  rayleigh_quotients(backend_, k.data<float>(), x.basis[side]->data<float>(), lam.data<float>(), d);
  const double k2 = backend_.sum_squares_in_order(k.data<float>(), d * d);
  const double lam2 = backend_.sum_squares_in_order(lam.data<float>(), d);
  const double knorm = std::sqrt(k2);
  return c_.adaptive_update_tolerance * knorm >= knorm - std::sqrt(lam2);
}

void SoapUpdate::update_factors(std::span<SoapMatrix> xs) {
  PhaseTimer timer(times_, backend_, SoapPhase::Factors);
  // (1) Kronecker factors with the current gradient: every statistic of every matrix as one
  // gram_many. KL-Shampoo: L takes G C_R G^T and R takes G^T C_L G, C = Q diag(max(lam, eps)^-1 /
  // dim) Q^T from the stored eigen data; both statistics are formed before either factor changes,
  // each as the Gram matrix Y Y^T of Y = G B_R or G^T B_L, B = Q diag(max(lam, eps)^-1/2 /
  // dim^1/2): C = B B^T itself is never formed (an n^3 product less).
  std::vector<core::GramTask> grams;
  std::vector<std::array<core::Tensor, 2>> stats(xs.size());
  std::vector<core::Tensor> ys;
  for (size_t i = 0; i < xs.size(); ++i) {
    SoapMatrix& x = xs[i];
    const int64_t m = x.m, n = x.n;
    const float* g = x.grad.data<float>();
    std::array<core::Tensor, 2>& stat = stats[i];
    if (c_.use_kl_shampoo) {
      ENGINE_CHECK(x.factor[0] && x.factor[1], "use_kl_shampoo needs both factors of '" + x.name +
                                                   "' (a side exceeds " +
                                                   "max_precond_dim or the parameter is 1-D)");
      const int64_t dims[2] = {m, n};
      core::Tensor b[2];
      for (int s = 0; s < 2; ++s) {
        b[s] = backend_tensor(backend_, {dims[s], dims[s]});
        ops_->kl_root_weight_columns(b[s].data<float>(), x.basis[s]->data<float>(),
                                     x.eigenvalues[s]->data<float>(), dims[s], c_.eps);
      }
      core::Tensor y0 = backend_tensor(backend_, {m, n}), y1 = backend_tensor(backend_, {n, m});
      matmul(backend_, g, false, b[1].data<float>(), false, y0.data<float>(), m, n, n);  // G B_R
      matmul(backend_, g, true, b[0].data<float>(), false, y1.data<float>(), n, m, m);   // G^T B_L
      stat[0] = backend_tensor(backend_, {m, m});
      stat[1] = backend_tensor(backend_, {n, n});
      grams.push_back({y0.data<float>(), stat[0].data<float>(), m, n, true});
      grams.push_back({y1.data<float>(), stat[1].data<float>(), n, m, true});
      ys.push_back(std::move(y0));
      ys.push_back(std::move(y1));
      continue;
    }
    if (x.factor[0]) {
      stat[0] = backend_tensor(backend_, {m, m});
      grams.push_back({g, stat[0].data<float>(), m, n, true});  // G G^T
    }
    if (x.factor[1]) {
      stat[1] = backend_tensor(backend_, {n, n});
      grams.push_back({g, stat[1].data<float>(), m, n, false});  // G^T G
    }
  }
  backend_.gram_many(grams);
  for (size_t i = 0; i < xs.size(); ++i) {
    SoapMatrix& x = xs[i];
    double bs = c_.shampoo_beta;
    if (c_.correct_shampoo_beta_bias)
      bs = 1.0 - (1.0 - bs) / (1.0 - std::pow(bs, static_cast<double>(*x.step + 1)));
    const int64_t dims[2] = {x.m, x.n};
    for (int s = 0; s < 2; ++s)
      if (x.factor[s])
        backend_.lerp(x.factor[s]->data<float>(), stats[i][s].data<float>(),
                      static_cast<float>(1.0 - bs), dims[s] * dims[s]);
  }
}

void SoapUpdate::collect(std::span<SoapMatrix> xs, RefreshBatch& batch) {
  update_factors(xs);
  for (SoapMatrix& x : xs)
    plan_refresh(x, batch);
}

void SoapUpdate::plan_refresh(SoapMatrix& x, RefreshBatch& batch) {
  const int64_t t = *x.step;
  const int64_t m = x.m, n = x.n;
  const int64_t dims[2] = {m, n};
  // (2) Whether and how the eigenbases are refreshed this step.
  const int64_t warmup = c_.adam_warmup_steps;
  x.refresh = (x.factor[0] || x.factor[1]) && t >= warmup && t % c_.precondition_frequency == 0;
  if (x.refresh && c_.use_adaptive_criteria && t > warmup) {
    PhaseTimer criterion_timer(times_, backend_, SoapPhase::Sort);
    bool all_met = true;
    for (int s = 0; s < 2; ++s)
      if (x.factor[s]) all_met = meets_criterion(x, s) && all_met;
    x.refresh = !all_met;
  }
  if (!x.refresh) return;
  std::optional<PhaseTimer> timer;
  timer.emplace(times_, backend_, SoapPhase::Rotate);
  rotate_out(x, x.exp_avg->data<float>());
  timer.emplace(times_, backend_, SoapPhase::Sort);
  const bool eigh_now = c_.use_eigh || t == warmup;  // the first refresh is an eigh
  for (int s = 0; s < 2; ++s) {
    if (!x.factor[s]) continue;
    const int64_t d = dims[s];
    FactorRefresh f{x.factor[s]->data<float>(),
                    x.basis[s]->data<float>(),
                    x.eigenvalues[s]->data<float>(),
                    d,
                    eigh_now,
                    false};
    if (!eigh_now && c_.qr_sort_before) {
      // Amortized reference: the refresh sorts the old basis by Rayleigh quotients with the new
      // factor before iterating; finish() permutes V along this side the same way.
      x.sort_order[s] = std::make_unique<BackendIndices>(backend_, d);
      f.sort_before_order = x.sort_order[s]->get();
    } else if (!eigh_now) {
      f.sort_after = true;
    }
    batch.add(f);
  }
}

void SoapUpdate::permute_second_moment(SoapMatrix& x) {
  for (int s = 0; s < 2; ++s) {
    if (!x.sort_order[s]) continue;
    float* v = x.exp_avg_sq->data<float>();
    const int32_t* order = x.sort_order[s]->get();
    core::Tensor permuted = backend_tensor(backend_, {x.m, x.n});
    if (s == 0)
      backend_.gather_rows(permuted.data<float>(), v, order, nullptr, x.m, x.n);
    else
      backend_.gather_columns(permuted.data<float>(), v, order, x.m, x.n);
    backend_.copy(v, permuted.data<float>(), permuted.nbytes());
    x.sort_order[s].reset();
  }
}

void SoapUpdate::finish(SoapMatrix& x) {
  const int64_t t = *x.step;
  const double k = static_cast<double>(t + 1);
  const int64_t size = x.m * x.n;
  float* mom = x.exp_avg->data<float>();
  float* var = x.exp_avg_sq->data<float>();
  if (x.refresh) {
    {
      PhaseTimer timer(times_, backend_, SoapPhase::Sort);
      permute_second_moment(x);
    }
    PhaseTimer timer(times_, backend_, SoapPhase::Rotate);
    rotate_in(x, mom);
  }
  PhaseTimer timer(times_, backend_, SoapPhase::Update);

  // (3) l2 decay enters the gradient after the factors saw it.
  float* g = x.grad.data<float>();
  if (c_.weight_decay_method == WeightDecayMethod::L2 && c_.weight_decay != 0)
    backend_.add_scaled(g, static_cast<float>(c_.weight_decay), x.param, size);

  // (4) Adam in eigen coordinates (parameter coordinates during the warm-up).
  const bool warm = t < c_.adam_warmup_steps;
  if (!warm) rotate_in(x, g);
  kmath::SoapAdamStep adam;
  adam.raw = c_.adam_eps_raw;
  adam.nesterov = c_.nesterov;
  adam.beta1 = static_cast<float>(c_.beta1);
  adam.beta2 = static_cast<float>(c_.beta2);
  adam.w1 = static_cast<float>(1.0 - c_.beta1);
  adam.w2 = static_cast<float>(1.0 - c_.beta2);
  adam.eps = static_cast<float>(c_.eps);
  if (!c_.adam_eps_raw && c_.correct_bias) {
    adam.c1 = static_cast<float>(1.0 - std::pow(c_.beta1, k));
    adam.c2 = static_cast<float>(1.0 - std::pow(c_.beta2, k));
    adam.cn = static_cast<float>(1.0 - std::pow(c_.beta1, k + 1));
  }
  x.update = backend_tensor(backend_, {x.m, x.n});
  float* d = x.update.data<float>();
  ops_->adam(d, mom, var, g, size, adam);
  if (!warm) rotate_out(x, d);
  if (c_.adam_eps_raw && c_.correct_bias) {
    // Bias correction on the step size: sqrt(1 - b2^k) / (1 - b1^k).
    const float s =
        static_cast<float>(std::sqrt(1.0 - std::pow(c_.beta2, k)) / (1.0 - std::pow(c_.beta1, k)));
    backend_.scale(d, s, size);
  }
  if (c_.max_update_rms > 0) ops_->clip_update_rms(d, size, c_.max_update_rms);
  ++*x.step;
}

double SoapConfig::decay_alpha(double lr) const {
  const double wd = weight_decay;
  switch (weight_decay_method) {
    case WeightDecayMethod::Decoupled:
      return -wd * lr;
    case WeightDecayMethod::Independent:
      return -wd;
    case WeightDecayMethod::Palm:
      return -lr * lr * wd;
    case WeightDecayMethod::L2:
      break;
  }
  return 0.0;
}

void SoapUpdate::apply(SoapMatrix& x, double lr) {
  PhaseTimer timer(times_, backend_, SoapPhase::Update);
  const int64_t size = x.m * x.n;
  if (c_.weight_decay != 0 && c_.weight_decay_method != WeightDecayMethod::L2) {
    // P + alpha P in one fused add, as the reference writes it.
    backend_.add_scaled(x.param, static_cast<float>(c_.decay_alpha(lr)), x.param, size);
  }
  backend_.add_scaled(x.param, static_cast<float>(-lr), x.update.data<float>(), size);
}

void SoapUpdate::run(std::vector<SoapMatrix>& xs, double lr) {
  RefreshBatch batch;
  collect(xs, batch);
  batch.run(backend_, *ops_, c_.power_iter_steps, c_.batched_refresh, nullptr, times_);
  for (SoapMatrix& x : xs) {
    finish(x);
    apply(x, lr);
  }
}

// ---- the optimizer
// --------------------------------------------------------------------------------

Soap::Soap(const SoapConfig& config, const char* kind, bool stack_3d)
    : config_(config), kind_(kind), stack_3d_(stack_3d), slots_(kind, kSoapTensorSlots, {"step"}) {}

std::pair<int64_t, int64_t> Soap::matrix_shape(const core::Shape& shape) const {
  if (shape.size() == 1) return {shape[0], 1};
  if (shape.size() == 3) return stacked_shape(shape);
  return {shape[0], shape[1]};
}

void Soap::check_param(const std::string& name, const core::Shape& shape) const {
  const std::string what =
      std::string(kind_) + ": parameter '" + name + "' " + core::shape_str(shape);
  ENGINE_CHECK(!shape.empty(), what + " is a scalar; route it to adamw");
  ENGINE_CHECK(shape.size() != 1 || config_.precondition_1d,
               what + " is 1-D: set 'precondition_1d: true' in its group or route it to adamw");
  ENGINE_CHECK(shape.size() != 3 || stack_3d_,
               what + " is 3-D: route it to stacked_soap, which stacks the batch dimension");
  ENGINE_CHECK(shape.size() <= 3, what + " has more than 3 dimensions");
  if (config_.use_kl_shampoo) {
    const auto [m, n] = matrix_shape(shape);
    ENGINE_CHECK(shape.size() != 1 && m <= config_.max_precond_dim && n <= config_.max_precond_dim,
                 what + ": use_kl_shampoo needs both Kronecker factors, but the parameter is " +
                     "1-D or a side exceeds max_precond_dim " +
                     std::to_string(config_.max_precond_dim));
  }
}

SoapMatrix Soap::bind(const std::string& name, int64_t m, int64_t n, float* param,
                      const float* grad, bool one_d, core::Backend& backend) {
  SoapMatrix x;
  x.name = name;
  x.m = m;
  x.n = n;
  x.param = param;
  x.grad = backend_tensor(backend, {m, n});
  backend.copy(x.grad.data<float>(), grad, x.grad.nbytes());
  x.exp_avg = &slots_.tensor(name, "exp_avg", {m, n}, backend);
  x.exp_avg_sq = &slots_.tensor(name, "exp_avg_sq", {m, n}, backend);
  const int64_t dims[2] = {m, n};
  for (int s = 0; s < 2; ++s) {
    const int64_t d = dims[s];
    const bool present = one_d ? s == 0 && config_.precondition_1d && d <= config_.max_precond_dim
                               : d <= config_.max_precond_dim;
    if (!present) continue;
    x.factor[s] = &slots_.tensor(name, kFactorSlot[s], {d, d}, backend);
    bool created = false;
    x.basis[s] = &slots_.tensor(name, kBasisSlot[s], {d, d}, backend, &created);
    if (created) backend.set_identity(x.basis[s]->data<float>(), d);
    x.eigenvalues[s] = &slots_.tensor(name, kEigenvalueSlot[s], {d}, backend);
  }
  x.step = &slots_.counter(name, "step");
  return x;
}

void Soap::step(std::span<const ParamShard> params, const StepContext& ctx) {
  core::Backend& backend = backend_of(ctx);
  std::vector<SoapMatrix> xs;
  std::vector<core::Tensor> stacks;  // permuted copies of 3-D parameters, written back after
  std::vector<const ParamShard*> stacked_of;
  for (const ParamShard& p : params) {
    check_shard(p, kind_);
    ENGINE_CHECK(p.begin == 0 && p.value.shape() == p.full_shape,
                 std::string(kind_) + ": '" + p.name +
                     "' must be stepped whole (Owned placement), got " + p.value.str());
    if (p.value.numel() == 0) continue;
    check_param(p.name, p.full_shape);
    const auto [m, n] = matrix_shape(p.full_shape);
    if (p.full_shape.size() == 3 && stack_permutes(p.full_shape)) {
      core::Tensor s = backend_tensor(backend, {m, n});
      core::Tensor g = backend_tensor(backend, {m, n});
      stack(backend, p.value.data<float>(), s.data<float>(), p.full_shape);
      stack(backend, p.grad.data<float>(), g.data<float>(), p.full_shape);
      xs.push_back(bind(p.name, m, n, s.data<float>(), g.data<float>(), false, backend));
      stacks.push_back(std::move(s));
      stacked_of.push_back(&p);
    } else {
      xs.push_back(bind(p.name, m, n, p.value.data<float>(), p.grad.data<float>(),
                        p.full_shape.size() == 1, backend));
    }
  }
  SoapUpdate(config_, backend, times_).run(xs, config_.lr * ctx.lr_scale);
  for (size_t i = 0; i < stacks.size(); ++i)
    unstack(backend, stacks[i].data<float>(), stacked_of[i]->value.data<float>(),
            stacked_of[i]->full_shape);
}

}  // namespace optim
