// A test rig for the layers of model/layers/: a chain of layers on the CPU backend with its own
// parameters, activation plan and batch, and a check of a backward against central differences
// of the forward (the same float32 forward, its loss summed in float64).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/rng.h"
#include "model/activation_plan.h"
#include "model/layer.h"
#include "model/param_store.h"

namespace test_model {

class LayerRig {
 public:
  LayerRig(const model::ModelConfig& config, int B, int T)
      : config_(config),
        params_(config_, core::cpu_backend()),
        ctx_(config_, core::cpu_backend(), params_) {
    ctx_.B = B;
    ctx_.T = T;
    const int64_t N = ctx_.N();
    tokens_.assign(static_cast<size_t>(N), 0);
    targets_.assign(static_cast<size_t>(N), 0);
    losses_.assign(2, 0.0f);
    ctx_.tokens = tokens_.data();
    ctx_.targets = targets_.data();
    ctx_.losses = losses_.data();
    ctx_.want_grad = true;
    input_.assign(static_cast<size_t>(N * config_.d_model), 0.0f);
  }

  model::Context& ctx() { return ctx_; }
  model::ParamStore& params() { return params_; }
  const model::ModelConfig& config() const { return config_; }
  std::vector<int32_t>& tokens() { return tokens_; }
  std::vector<int32_t>& targets() { return targets_; }
  // The chain's input stream [N, D] (f32 precision).
  std::vector<float>& input() { return input_; }
  const std::vector<float>& losses() const { return losses_; }

  template <typename L>
  L* add(std::unique_ptr<L> layer) {
    L* raw = layer.get();
    layers_.push_back(std::move(layer));
    return raw;
  }

  // Every parameter drawn: matrices N(0, scale^2 / fan_in), vectors 0.6 + 0.4 N(0, 1).
  void draw_params(uint64_t seed, double scale = 1.0) {
    for (size_t i = 0; i < params_.table().size(); ++i) {
      core::Tensor p = params_.param(i);
      const auto& info = params_.table()[i];
      float* d = p.data<float>();
      const bool matrix = info.shape.size() > 1;
      const double fan = matrix ? double(info.shape.back()) : 1.0;
      const int64_t valid =
          info.valid_rows >= 0 ? info.valid_rows * (info.numel / info.shape[0]) : info.numel;
      for (int64_t e = 0; e < p.numel(); ++e) {
        const double z = core::rng_normal(core::rng_hash(seed, i), e);
        d[e] = e >= valid ? 0.0f
                          : static_cast<float>(matrix ? scale * z / std::sqrt(fan) : 0.6 + 0.4 * z);
      }
    }
    params_.params_updated();
  }

  // Arrays beside the chain's layers that its plan also lays out (the attention masks).
  void also_plan(std::function<void(model::ActivationPlan&)> f) { extras_.push_back(std::move(f)); }

  // Both passes of the plan over the chain and the context's scratch.
  void plan() {
    model::ActivationPlan plan(config_.precision == model::Precision::Bf16);
    const int64_t ND = ctx_.N() * config_.d_model;
    auto layout = [&] {
      for (auto& f : extras_)
        f(plan);
      for (auto& l : layers_)
        l->plan(plan, ctx_);
      ctx_.dres = plan.shared("stream.dres", ND);
      ctx_.dln = plan.shared("stream.dln", ND);
      ctx_.dmix = plan.shared("stream.dmix", ND);
      ctx_.linear.set_dy_scratch(plan.shared_bf16("linear.dy_bf16", ND));
    };
    plan.begin(nullptr);
    layout();
    acts_ = core::Tensor::zeros({plan.finish_count()});
    plan.begin(acts_.data<float>());
    layout();
  }

  // The chain's forward from input(); returns its output stream.
  model::Stream forward() {
    losses_.assign(2, 0.0f);
    model::Stream x{input_.data(), nullptr};
    for (auto& l : layers_)
      x = l->forward(ctx_, x);
    return x;
  }
  // The chain's backward from d output = dout (null: the head writes its own); returns d input.
  std::vector<float> backward(const std::vector<float>* dout) {
    const int64_t ND = ctx_.N() * config_.d_model;
    for (int64_t i = 0; i < ND; ++i)
      ctx_.dres[i] = dout ? (*dout)[static_cast<size_t>(i)] : 0.0f;
    for (auto& l : layers_)
      l->begin_backward(ctx_);
    for (auto l = layers_.rbegin(); l != layers_.rend(); ++l)
      (*l)->backward(ctx_);
    return std::vector<float>(ctx_.dres, ctx_.dres + ND);
  }

 private:
  model::ModelConfig config_;
  model::ParamStore params_;
  model::Context ctx_;
  std::vector<std::unique_ptr<model::Layer>> layers_;
  std::vector<std::function<void(model::ActivationPlan&)>> extras_;
  core::Tensor acts_;
  std::vector<int32_t> tokens_, targets_;
  std::vector<float> losses_, input_;
};

// sum_i out_i w_i in float64 over an f32 stream: the loss whose d out is w.
inline double weighted_sum(model::Stream out, const std::vector<float>& w) {
  double s = 0.0;
  for (size_t i = 0; i < w.size(); ++i)
    s += double(out.f32[i]) * w[i];
  return s;
}

inline std::vector<float> random_floats(size_t n, uint64_t seed, double scale = 1.0) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(scale * core::rng_normal(seed, i));
  return v;
}

// The analytic gradient `grad` of `loss` with respect to the floats at x[0, n) against central
// differences of loss (float32 forward, float64 sum) along the gradient and along a random
// direction, both unit: each slope within `tol` of |grad| (a missing or wrong term moves it by
// O(|grad|)). x is restored afterwards; `changed` runs after each write (bf16 copies).
inline void expect_slopes(
    const std::string& name, float* x, const std::vector<float>& grad,
    const std::function<double()>& loss, double h = 1e-2, double tol = 1e-2,
    const std::function<void()>& changed = [] {}) {
  double gn = 0.0;
  for (float v : grad)
    gn += double(v) * v;
  gn = std::sqrt(gn);
  ASSERT_GT(gn, 0.0) << name << " gets no gradient";
  std::vector<double> rnd(grad.size());
  double rn = 0.0;
  for (size_t e = 0; e < grad.size(); ++e)
    rnd[e] = core::rng_normal(core::rng_hash(8, grad.size()), e), rn += rnd[e] * rnd[e];
  const std::vector<float> x0(x, x + grad.size());
  double worst = 0.0;
  for (int dir = 0; dir < 2; ++dir) {
    std::vector<double> u(grad.size());
    double slope = 0.0;
    for (size_t e = 0; e < grad.size(); ++e) {
      u[e] = dir == 0 ? grad[e] / gn : rnd[e] / std::sqrt(rn);
      slope += u[e] * grad[e];
    }
    auto at = [&](double step) {
      for (size_t e = 0; e < grad.size(); ++e)
        x[e] = static_cast<float>(x0[e] + step * u[e]);
      changed();
      return loss();
    };
    const double fd = (at(h) - at(-h)) / (2 * h);
    const double err = std::abs(fd - slope) / gn;
    worst = std::max(worst, err);
    EXPECT_LT(err, tol) << name << (dir == 0 ? " along the gradient" : " along a random direction")
                        << ": differences " << fd << ", analytic " << slope << ", |g| " << gn;
  }
  for (size_t e = 0; e < grad.size(); ++e)
    x[e] = x0[e];
  changed();
  std::printf("[ measured ] %s: slopes vs central differences %.3g of |g| (tolerance %.0g)\n",
              name.c_str(), worst, tol);
}

}  // namespace test_model
