#include "optim/adamw/adamw.h"

#include <cmath>
#include <vector>

#include "core/check.h"
#include "optim/adamw/adamw_ops.h"

namespace optim {

AdamWConfig AdamWConfig::from_yaml(HyperReader& r) {
  AdamWConfig c;
  c.lr = r.number("lr", c.lr);
  std::vector<double> betas = r.numbers("betas", {c.beta1, c.beta2});
  if (betas.size() != 2) r.fail("betas", "must be a list of two numbers [beta1, beta2]");
  c.beta1 = betas[0];
  c.beta2 = betas[1];
  c.eps = r.number("eps", c.eps);
  c.weight_decay = r.number("weight_decay", c.weight_decay);
  c.lr_mul = r.number("lr_mul", c.lr_mul);
  c.wd_mul = r.number("wd_mul", c.wd_mul);
  const std::string mode = r.string("eps_mode", "spec");
  if (mode != "spec" && mode != "torch") r.fail("eps_mode", "must be 'spec' or 'torch'");
  c.torch_eps = mode == "torch";
  c.cautious_wd = cautious_weight_decay(r, c.cautious_wd);
  if (!(c.lr >= 0)) r.fail("lr", "must be >= 0");  // also refuses NaN
  if (!(c.beta1 >= 0 && c.beta1 < 1)) r.fail("betas", "beta1 must be in [0, 1)");
  if (!(c.beta2 >= 0 && c.beta2 < 1)) r.fail("betas", "beta2 must be in [0, 1)");
  // eps keeps the update finite where the second moment is 0 (a gradient that was 0 so far):
  // at 0 that update is 0/0, and the run diverged some steps later.
  if (!(c.eps > 0))
    r.fail("eps", "must be > 0 (it keeps the update finite where the second moment is 0)");
  // A negative decay grows the weights; a negative multiplier turns the step around.
  if (!(c.weight_decay >= 0)) r.fail("weight_decay", "must be >= 0");
  if (!(c.lr_mul >= 0)) r.fail("lr_mul", "must be >= 0");
  if (!(c.wd_mul >= 0)) r.fail("wd_mul", "must be >= 0");
  return c;
}

AdamW::AdamW(const AdamWConfig& config) : config_(config) {}

void AdamW::check_param(const std::string& name, const core::Shape& shape) const {
  ENGINE_CHECK(!shape.empty(), "adamw: parameter '" + name + "' is a scalar; store it as [1]");
}

void AdamW::step(std::span<const ParamShard> params, const StepContext& ctx) {
  core::Backend& backend = backend_of(ctx);
  const std::unique_ptr<AdamWOps> ops = make_adamw_ops(backend);
  const double lr = config_.lr * ctx.lr_scale * config_.lr_mul;
  const double wd = config_.weight_decay * config_.wd_mul;
  kmath::AdamWStep s;
  s.beta1 = config_.beta1;
  s.beta2 = config_.beta2;
  s.eps = config_.eps;
  s.decay = config_.cautious_wd ? 1.0 : 1.0 - lr * wd;
  s.cautious = config_.cautious_wd ? lr * lr * wd : 0.0;
  std::vector<AdamWTensor> tensors;
  for (const ParamShard& p : params) {
    check_shard(p, "adamw");
    float* m = slots_.tensor(p.name, "exp_avg", p.value.shape(), backend).data<float>();
    float* v = slots_.tensor(p.name, "exp_avg_sq", p.value.shape(), backend).data<float>();
    const int64_t t = ++slots_.counter(p.name, "step");
    const double bc1 = 1.0 - std::pow(s.beta1, static_cast<double>(t));
    const double bc2 = 1.0 - std::pow(s.beta2, static_cast<double>(t));
    // spec: lr sqrt(bc2) / bc1 * m / (sqrt(v) + eps); torch: lr / bc1 * m / (sqrt(v / bc2) + eps)
    s.step_size = config_.torch_eps ? lr / bc1 : lr * std::sqrt(bc2) / bc1;
    s.v_scale = config_.torch_eps ? 1.0 / std::sqrt(bc2) : 1.0;
    tensors.push_back(
        {p.value.data<float>(), m, v, p.grad.data<float>(), p.value.numel(), s, ctx.grad_scale});
  }
  ops->update(tensors);
}

void AdamW::save_state(OptimizerState& out) const {
  slots_.save(out);
}

void AdamW::load_state(const OptimizerState& in) {
  slots_.load(in);
}

}  // namespace optim
