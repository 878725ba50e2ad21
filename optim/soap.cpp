#include "optim/soap.h"

#include <cmath>

#include "engine/core/check.h"
#include "optim/stacked_soap.h"

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

// torch.lerp's two-branch form: a <- a + w (b - a) for w < 0.5, else b - (b - a)(1 - w).
void lerp_into(float* a, const float* b, float w, int64_t n) {
  if (w < 0.5f) {
    for (int64_t i = 0; i < n; ++i)
      a[i] = a[i] + w * (b[i] - a[i]);
  } else {
    const float v = 1.0f - w;
    for (int64_t i = 0; i < n; ++i)
      a[i] = b[i] - (b[i] - a[i]) * v;
  }
}

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

void SoapUpdate::rotate_out(const SoapMatrix& x, float* a) {
  const int64_t m = x.m, n = x.n;
  std::vector<float> tmp(static_cast<size_t>(m * n));
  if (x.basis[0]) {
    matmul(backend_, x.basis[0]->data<float>(), false, a, false, tmp.data(), m, n, m);
    std::copy(tmp.begin(), tmp.end(), a);
  }
  if (x.basis[1]) {
    matmul(backend_, a, false, x.basis[1]->data<float>(), true, tmp.data(), m, n, n);
    std::copy(tmp.begin(), tmp.end(), a);
  }
}

void SoapUpdate::rotate_in(const SoapMatrix& x, float* a) {
  const int64_t m = x.m, n = x.n;
  std::vector<float> tmp(static_cast<size_t>(m * n));
  if (x.basis[0]) {
    matmul(backend_, x.basis[0]->data<float>(), true, a, false, tmp.data(), m, n, m);
    std::copy(tmp.begin(), tmp.end(), a);
  }
  if (x.basis[1]) {
    matmul(backend_, a, false, x.basis[1]->data<float>(), false, tmp.data(), m, n, n);
    std::copy(tmp.begin(), tmp.end(), a);
  }
}

// Met when tol ||K||_F >= ||K||_F - ||diag(Q^T K Q)||_2: the basis nearly diagonalises K.
bool SoapUpdate::meets_criterion(const SoapMatrix& x, int side) {
  const core::Tensor& k = *x.factor[side];
  const int64_t d = k.size(0);
  std::vector<float> lam(static_cast<size_t>(d));
  rayleigh_quotients(backend_, k.data<float>(), x.basis[side]->data<float>(), lam.data(), d);
  double k2 = 0, lam2 = 0;
  const float* kd = k.data<float>();
  for (int64_t i = 0; i < d * d; ++i)
    k2 += static_cast<double>(kd[i]) * kd[i];
  for (float l : lam)
    lam2 += static_cast<double>(l) * l;
  const double knorm = std::sqrt(k2);
  return c_.adaptive_update_tolerance * knorm >= knorm - std::sqrt(lam2);
}

void SoapUpdate::collect(SoapMatrix& x, RefreshBatch& batch) {
  const int64_t t = *x.step;
  const int64_t m = x.m, n = x.n;
  const int64_t dims[2] = {m, n};
  double bs = c_.shampoo_beta;
  if (c_.correct_shampoo_beta_bias)
    bs = 1.0 - (1.0 - bs) / (1.0 - std::pow(bs, static_cast<double>(t + 1)));
  const float* g = x.grad.data<float>();

  // (1) Kronecker factors with the current gradient. KL-Shampoo: L takes G C_R G^T and R takes
  // G^T C_L G, C = Q diag(max(lam, eps)^-1 / dim) Q^T from the stored eigen data; both
  // statistics are formed before either factor changes.
  std::vector<float> stat[2];
  if (c_.use_kl_shampoo) {
    ENGINE_CHECK(x.factor[0] && x.factor[1], "use_kl_shampoo needs both factors of '" + x.name +
                                                 "' (a side exceeds " +
                                                 "max_precond_dim or the parameter is 1-D)");
    std::vector<float> c[2];
    for (int s = 0; s < 2; ++s) {
      const int64_t d = dims[s];
      const float* q = x.basis[s]->data<float>();
      const float* lam = x.eigenvalues[s]->data<float>();
      std::vector<float> scaled(static_cast<size_t>(d * d));
      for (int64_t j = 0; j < d; ++j) {
        const float w =
            static_cast<float>(1.0 / static_cast<double>(d) /
                               std::max(static_cast<double>(lam[j]), static_cast<double>(c_.eps)));
        for (int64_t i = 0; i < d; ++i)
          scaled[i * d + j] = q[i * d + j] * w;
      }
      c[s].resize(static_cast<size_t>(d * d));
      matmul(backend_, scaled.data(), false, q, true, c[s].data(), d, d, d);
    }
    std::vector<float> tmp(static_cast<size_t>(m * n));
    stat[0].resize(static_cast<size_t>(m * m));
    matmul(backend_, g, false, c[1].data(), false, tmp.data(), m, n, n);  // G C_R
    matmul(backend_, tmp.data(), false, g, true, stat[0].data(), m, m, n);
    stat[1].resize(static_cast<size_t>(n * n));
    matmul(backend_, g, true, c[0].data(), false, tmp.data(), n, m, m);  // G^T C_L
    matmul(backend_, tmp.data(), false, g, false, stat[1].data(), n, n, m);
  } else {
    if (x.factor[0]) {
      stat[0].resize(static_cast<size_t>(m * m));
      matmul(backend_, g, false, g, true, stat[0].data(), m, m, n);
    }
    if (x.factor[1]) {
      stat[1].resize(static_cast<size_t>(n * n));
      matmul(backend_, g, true, g, false, stat[1].data(), n, n, m);
    }
  }
  for (int s = 0; s < 2; ++s)
    if (x.factor[s])
      lerp_into(x.factor[s]->data<float>(), stat[s].data(), static_cast<float>(1.0 - bs),
                dims[s] * dims[s]);

  // (2) Whether and how the eigenbases are refreshed this step.
  const int64_t warmup = c_.adam_warmup_steps;
  x.refresh = (x.factor[0] || x.factor[1]) && t >= warmup && t % c_.precondition_frequency == 0;
  if (x.refresh && c_.use_adaptive_criteria && t > warmup) {
    bool all_met = true;
    for (int s = 0; s < 2; ++s)
      if (x.factor[s]) all_met = meets_criterion(x, s) && all_met;
    x.refresh = !all_met;
  }
  if (!x.refresh) return;
  rotate_out(x, x.exp_avg->data<float>());
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
      // Amortized reference: sort the old basis by Rayleigh quotients with the new factor and
      // permute V along this side with it, then iterate without sorting again.
      rayleigh_quotients(backend_, f.k, f.q, f.lam, d);
      const std::vector<int64_t> order = descending_order(f.lam, d);
      permute_columns(f.q, d, d, order);
      std::vector<float> sorted(static_cast<size_t>(d));
      for (int64_t j = 0; j < d; ++j)
        sorted[j] = f.lam[order[j]];
      std::copy(sorted.begin(), sorted.end(), f.lam);
      float* v = x.exp_avg_sq->data<float>();
      if (s == 0)
        permute_rows(v, m, n, order);
      else
        permute_columns(v, m, n, order);
    } else if (!eigh_now) {
      f.sort_after = true;
    }
    batch.add(f);
  }
}

void SoapUpdate::finish(SoapMatrix& x) {
  const int64_t t = *x.step;
  const double k = static_cast<double>(t + 1);
  const int64_t size = x.m * x.n;
  float* mom = x.exp_avg->data<float>();
  float* var = x.exp_avg_sq->data<float>();
  if (x.refresh) rotate_in(x, mom);

  // (3) l2 decay enters the gradient after the factors saw it.
  float* g = x.grad.data<float>();
  if (c_.weight_decay_method == WeightDecayMethod::L2 && c_.weight_decay != 0) {
    const float wd = static_cast<float>(c_.weight_decay);
    for (int64_t i = 0; i < size; ++i)
      g[i] = g[i] + wd * x.param[i];
  }

  // (4) Adam in eigen coordinates (parameter coordinates during the warm-up).
  const bool warm = t < c_.adam_warmup_steps;
  if (!warm) rotate_in(x, g);
  const float b1 = static_cast<float>(c_.beta1), b2 = static_cast<float>(c_.beta2);
  if (c_.adam_eps_raw) {
    for (int64_t i = 0; i < size; ++i) {
      mom[i] = b1 * mom[i] + (1.0f - b1) * g[i];
      var[i] = b2 * var[i] + (1.0f - b2) * g[i] * g[i];
    }
  } else {
    std::vector<float> g2(static_cast<size_t>(size));
    for (int64_t i = 0; i < size; ++i)
      g2[i] = g[i] * g[i];
    lerp_into(mom, g, static_cast<float>(1.0 - c_.beta1), size);
    lerp_into(var, g2.data(), static_cast<float>(1.0 - c_.beta2), size);
  }
  x.update = core::Tensor::empty({x.m, x.n});
  float* d = x.update.data<float>();
  const float eps = static_cast<float>(c_.eps);
  if (c_.adam_eps_raw) {
    for (int64_t i = 0; i < size; ++i)
      d[i] = mom[i] / (std::sqrt(var[i]) + eps);
  } else {
    const bool cb = c_.correct_bias;
    const float c1 = cb ? static_cast<float>(1.0 - std::pow(c_.beta1, k)) : 1.0f;
    const float c2 = cb ? static_cast<float>(1.0 - std::pow(c_.beta2, k)) : 1.0f;
    const float cn = cb ? static_cast<float>(1.0 - std::pow(c_.beta1, k + 1)) : 1.0f;
    for (int64_t i = 0; i < size; ++i) {
      const float num = c_.nesterov ? b1 * mom[i] / cn + (1.0f - b1) * g[i] / c1 : mom[i] / c1;
      d[i] = num / (std::sqrt(var[i] / c2) + eps);
    }
  }
  if (!warm) rotate_out(x, d);
  if (c_.adam_eps_raw && c_.correct_bias) {
    // Bias correction on the step size: sqrt(1 - b2^k) / (1 - b1^k).
    const float s =
        static_cast<float>(std::sqrt(1.0 - std::pow(c_.beta2, k)) / (1.0 - std::pow(c_.beta1, k)));
    for (int64_t i = 0; i < size; ++i)
      d[i] *= s;
  }
  if (c_.max_update_rms > 0) {
    double ss = 0;
    for (int64_t i = 0; i < size; ++i)
      ss += static_cast<double>(d[i]) * d[i];
    const double rms = std::sqrt(ss / static_cast<double>(size));
    const float s = static_cast<float>(std::min(1.0, c_.max_update_rms / (rms + 1e-7)));
    for (int64_t i = 0; i < size; ++i)
      d[i] *= s;
  }
  ++*x.step;
}

void SoapUpdate::apply(SoapMatrix& x, double lr) {
  const int64_t size = x.m * x.n;
  float* p = x.param;
  const float* d = x.update.data<float>();
  const double wd = c_.weight_decay;
  if (wd != 0 && c_.weight_decay_method != WeightDecayMethod::L2) {
    // P + alpha P in one fused add, as the reference writes it.
    const double alpha = c_.weight_decay_method == WeightDecayMethod::Decoupled ? -wd * lr
                         : c_.weight_decay_method == WeightDecayMethod::Independent
                             ? -wd
                             : -lr * lr * wd;  // palm
    const float a = static_cast<float>(alpha);
    for (int64_t i = 0; i < size; ++i)
      p[i] = p[i] + a * p[i];
  }
  const float step = static_cast<float>(-lr);
  for (int64_t i = 0; i < size; ++i)
    p[i] = p[i] + step * d[i];
}

void SoapUpdate::run(std::vector<SoapMatrix>& xs, double lr) {
  RefreshBatch batch;
  for (SoapMatrix& x : xs)
    collect(x, batch);
  batch.run(backend_, c_.power_iter_steps, c_.batched_refresh);
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
  x.grad = core::Tensor::empty({m, n});
  std::copy_n(grad, m * n, x.grad.data<float>());
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
    if (created) {
      float* q = x.basis[s]->data<float>();
      for (int64_t i = 0; i < d; ++i)
        q[i * d + i] = 1.0f;
    }
    x.eigenvalues[s] = &slots_.tensor(name, kEigenvalueSlot[s], {d}, backend);
  }
  x.step = &slots_.counter(name, "step");
  return x;
}

void Soap::step(std::span<const ParamShard> params, const StepContext& ctx) {
  core::Backend& backend = backend_of(ctx);
  ENGINE_CHECK(backend.device().is_cpu(), std::string(kind_) +
                                              ": the update runs on host tensors only (backend " +
                                              backend.name() + ")");
  std::vector<SoapMatrix> xs;
  std::vector<core::Tensor> stacks;  // permuted copies of 3-D parameters, written back after
  std::vector<const ParamShard*> stacked_of;
  for (const ParamShard& p : params) {
    check_shard(p, kind_);
    ENGINE_CHECK(p.row_begin == 0 && p.value.shape() == p.full_shape,
                 std::string(kind_) + ": '" + p.name +
                     "' must be stepped whole (Owned placement), got " + p.value.str());
    if (p.value.numel() == 0) continue;
    check_param(p.name, p.full_shape);
    const auto [m, n] = matrix_shape(p.full_shape);
    if (p.full_shape.size() == 3 && stack_permutes(p.full_shape)) {
      core::Tensor s = core::Tensor::empty({m, n});
      core::Tensor g = core::Tensor::empty({m, n});
      stack(p.value.data<float>(), s.data<float>(), p.full_shape);
      stack(p.grad.data<float>(), g.data<float>(), p.full_shape);
      xs.push_back(bind(p.name, m, n, s.data<float>(), g.data<float>(), false, backend));
      stacks.push_back(std::move(s));
      stacked_of.push_back(&p);
    } else {
      xs.push_back(bind(p.name, m, n, p.value.data<float>(), p.grad.data<float>(),
                        p.full_shape.size() == 1, backend));
    }
  }
  SoapUpdate(config_, backend).run(xs, config_.lr * ctx.lr_scale);
  for (size_t i = 0; i < stacks.size(); ++i)
    unstack(stacks[i].data<float>(), stacked_of[i]->value.data<float>(), stacked_of[i]->full_shape);
}

}  // namespace optim
