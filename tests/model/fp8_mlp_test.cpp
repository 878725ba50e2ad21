// model.mlp_fp8 (model/layers/fp8_mlp.h): the FP8 MLP's forward against a float64 model of the
// record's roundings and scales, its backward the unquantised MLP's at the FP8 forward's
// activations, the delayed scales step by step (the activation's from the previous forward, the
// projection's from its own amax through step 16 and from the previous step's after), evaluation
// untouched, the GPU's against the CPU's (skipped without a device), and on a tiny model trained a
// few steps the FP8 MLP within bf16's distance of fp32.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "core/backend.h"
#include "core/check.h"
#include "core/kernel_math.h"
#include "core/rng.h"
#include "model/gpt.h"
#include "model/layers/fp8_mlp.h"
#include "tests/model/layer_rig.h"

namespace {

using core::kmath::Fp8;
using core::kmath::fp8_value;

model::ModelConfig mlp_config() {
  model::ModelConfig c;
  c.arch = model::Arch::Modern;
  c.n_layer = 1;
  c.n_head = 1;
  c.d_model = 64;
  c.seq_len = 16;
  c.vocab_size = 64;
  c.mlp_fp8 = true;
  return c;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v)
    m = std::max(m, std::fabs(x));
  return m;
}

// The MLP in float64 on x [N, D]: ln = rmsnorm(x); with fp8, pre = s_x s_fc sum Xq FCq (each
// operand e4m3 of its value over its scale, the scales formed in f32 as the engine forms them),
// y = s_a s_p sum Aq Pq with act_scale and proj_scale given; without, the plain products. Also
// the backward for dout: d x, d fc, d proj (the unquantised MLP's gradient at this pre and act).
struct MlpReference {
  std::vector<double> y, act, dx, dfc, dproj;
};

MlpReference mlp_reference(const std::vector<float>& x, const std::vector<float>& fc,
                           const std::vector<float>& proj, const std::vector<float>& dout,
                           int64_t N, int64_t D, float eps, bool fp8, float act_scale,
                           float proj_scale) {
  const int64_t F = 4 * D;
  std::vector<double> ln(static_cast<size_t>(N * D)), rstd(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    double ss = 0;
    for (int64_t d = 0; d < D; ++d)
      ss += double(x[n * D + d]) * x[n * D + d];
    rstd[n] = 1.0 / std::sqrt(ss / D + eps);
    for (int64_t d = 0; d < D; ++d)
      ln[n * D + d] = x[n * D + d] * rstd[n];
  }
  auto scale_of = [](const std::vector<double>& v) {
    return core::kmath::fp8_scale_from_amax(static_cast<float>(max_abs(v)), 1.0f / 448.0f);
  };
  auto quantised = [](const std::vector<double>& v, float s) {
    std::vector<double> q(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      q[i] = double(fp8_value(static_cast<float>(v[i] / s), Fp8::E4M3)) * s;
    return q;
  };
  const std::vector<double> fcd(fc.begin(), fc.end()), projd(proj.begin(), proj.end());
  const std::vector<double> lnq = fp8 ? quantised(ln, scale_of(ln)) : ln;
  const std::vector<double> fcq = fp8 ? quantised(fcd, scale_of(fcd)) : fcd;
  MlpReference r;
  std::vector<double> pre(static_cast<size_t>(N * F));
  r.act.resize(pre.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t f = 0; f < F; ++f) {
      double s = 0;
      for (int64_t d = 0; d < D; ++d)
        s += lnq[n * D + d] * fcq[f * D + d];
      pre[n * F + f] = s;
      r.act[n * F + f] = s > 0 ? s * s : 0.0;
    }
  const std::vector<double> actq = fp8 ? quantised(r.act, act_scale) : r.act;
  const std::vector<double> projq = fp8 ? quantised(projd, proj_scale) : projd;
  r.y.assign(static_cast<size_t>(N * D), 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t d = 0; d < D; ++d) {
      double s = 0;
      for (int64_t f = 0; f < F; ++f)
        s += actq[n * F + f] * projq[d * F + f];
      r.y[n * D + d] = s;
    }
  // Backward of y = relu(ln fc^T)^2 proj^T at this pre, unquantised operands.
  r.dproj.assign(static_cast<size_t>(D * F), 0.0);
  r.dfc.assign(static_cast<size_t>(F * D), 0.0);
  r.dx.assign(static_cast<size_t>(N * D), 0.0);
  std::vector<double> dln(static_cast<size_t>(D));
  for (int64_t n = 0; n < N; ++n) {
    std::fill(dln.begin(), dln.end(), 0.0);
    for (int64_t f = 0; f < F; ++f) {
      double dact = 0;
      for (int64_t d = 0; d < D; ++d) {
        dact += dout[n * D + d] * projd[d * F + f];
        r.dproj[d * F + f] += dout[n * D + d] * r.act[n * F + f];
      }
      const double dpre = pre[n * F + f] > 0 ? 2 * pre[n * F + f] * dact : 0.0;
      for (int64_t d = 0; d < D; ++d) {
        r.dfc[f * D + d] += dpre * ln[n * D + d];
        dln[d] += dpre * fcd[f * D + d];
      }
    }
    double dot = 0;
    for (int64_t d = 0; d < D; ++d)
      dot += dln[d] * ln[n * D + d];
    for (int64_t d = 0; d < D; ++d)
      r.dx[n * D + d] = dout[n * D + d] + rstd[n] * (dln[d] - ln[n * D + d] * dot / D);
  }
  return r;
}

double rel(const std::vector<float>& got, const std::vector<double>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff / norm);
}

std::vector<float> values_of(model::ParamStore& p, const char* name) {
  return p.param(p.index(name)).to_vector();
}

// One FP8 MLP block on 32 tokens (D = 64, F = 256) with a delayed activation scale that
// saturates its largest activations (643 of 8192): the output and gradients against the float64
// model of the same roundings within 1e-6 in norm (measured 7e-8 .. 2.5e-7: the f32 sums; no
// operand crossed a rounding midpoint), while the unquantised MLP is 0.57 away (the FP8 rounding
// itself, saturation included); the backward is the unquantised MLP's at the FP8 forward's
// activation.
TEST(Fp8Mlp, ForwardAndBackwardAreTheFloat64ModelOfTheRecordsRoundings) {
  const model::ModelConfig c = mlp_config();
  const int B = 2, T = 16;
  const int64_t N = B * T, D = c.d_model, F = c.d_ff();
  test_model::LayerRig rig(c, B, T);
  model::Fp8MlpScales scales(1, core::cpu_backend());
  rig.add(std::make_unique<model::Fp8Mlp>(rig.ctx(), 0, scales));
  rig.draw_params(41);
  rig.plan();
  rig.input() = test_model::random_floats(static_cast<size_t>(N * D), 42);
  const float act_scale = 2.0f / 448.0f;  // activations above 2 saturate
  scales.set_values({act_scale, 1.0f, 1.0f});
  const std::vector<float> x = rig.input();
  const model::Stream out = rig.forward();
  std::vector<float> y(static_cast<size_t>(N * D));
  for (size_t i = 0; i < y.size(); ++i)
    y[i] = out.f32[i] - x[i];
  const std::vector<float> dout = test_model::random_floats(static_cast<size_t>(N * D), 43);
  rig.params().zero_grad();
  const std::vector<float> dx = rig.backward(&dout);
  const std::vector<float> fc = values_of(rig.params(), "blocks.0.mlp.fc.weight");
  const std::vector<float> proj = values_of(rig.params(), "blocks.0.mlp.proj.weight");
  // Step 0: the projection's scale is its own amax / 448.
  double proj_amax = 0;
  for (float v : proj)
    proj_amax = std::max(proj_amax, std::fabs(double(v)));
  const float proj_scale =
      core::kmath::fp8_scale_from_amax(static_cast<float>(proj_amax), 1.0f / 448.0f);
  const MlpReference want =
      mlp_reference(x, fc, proj, dout, N, D, c.norm_eps, true, act_scale, proj_scale);
  const MlpReference plain =
      mlp_reference(x, fc, proj, dout, N, D, c.norm_eps, false, act_scale, proj_scale);
  int64_t saturated = 0;
  for (double a : want.act)
    saturated += a / act_scale > 448.0;
  EXPECT_GT(saturated, 0);
  const auto grad = [&](const char* name) {
    return rig.params().grad(rig.params().index(name)).to_vector();
  };
  const double y_err = rel(y, want.y), y_plain = rel(y, plain.y);
  const double dx_err = rel(dx, want.dx);
  const double dfc_err = rel(grad("blocks.0.mlp.fc.weight"), want.dfc);
  const double dproj_err = rel(grad("blocks.0.mlp.proj.weight"), want.dproj);
  std::printf(
      "[ measured ] %lld of %lld activations saturated; y vs the FP8 model %.3g, vs the "
      "unquantised %.3g; d x %.3g, d fc %.3g, d proj %.3g\n",
      static_cast<long long>(saturated), static_cast<long long>(N * F), y_err, y_plain, dx_err,
      dfc_err, dproj_err);
  EXPECT_LE(y_err, 1e-6);
  EXPECT_GE(y_plain, 0.1);
  EXPECT_LE(dx_err, 1e-6);
  EXPECT_LE(dfc_err, 1e-6);
  EXPECT_LE(dproj_err, 1e-6);
}

// The scales step by step on one block: the activation's is the last training forward's amax x
// 1.80 / 448 (1 at the start), the projection's its own amax / 448 through step 16, taken once a
// step, and from step 17 on the previous step's amax x 1.12 / 448, so that a projection grown
// more than 12% saturates; evaluation forwards leave every scale alone; set_values takes them
// back and the next training forward takes the projection's anew.
TEST(Fp8Mlp, DelayedScalesFollowTheRecord) {
  const model::ModelConfig c = mlp_config();
  const int B = 1, T = 16;
  const int64_t N = B * T, D = c.d_model;
  test_model::LayerRig rig(c, B, T);
  model::Fp8MlpScales scales(1, core::cpu_backend());
  rig.add(std::make_unique<model::Fp8Mlp>(rig.ctx(), 0, scales));
  rig.draw_params(51);
  rig.plan();
  rig.input() = test_model::random_floats(static_cast<size_t>(N * D), 52);
  EXPECT_EQ(scales.values(), (std::vector<float>{1.0f, 1.0f, 1.0f}));
  core::Tensor proj = rig.params().param(rig.params().index("blocks.0.mlp.proj.weight"));
  auto proj_amax = [&] {
    float m = 0;
    for (float v : proj.to_vector())
      m = std::max(m, std::fabs(v));
    return m;
  };
  auto grow_proj = [&](float by) {
    for (int64_t i = 0; i < proj.numel(); ++i)
      proj.data<float>()[i] *= by;
    rig.params().params_updated();
  };
  const float own = 1.0f / 448.0f, next = 1.12f / 448.0f;
  using core::kmath::fp8_scale_from_amax;

  rig.forward();  // step 0: bootstrapped
  std::vector<float> v = scales.values();
  EXPECT_EQ(v[1], fp8_scale_from_amax(proj_amax(), own));
  EXPECT_EQ(v[2], fp8_scale_from_amax(proj_amax(), next));
  // The activation's: its amax (the float64 model of the FP8 up projection's) x 1.80 / 448.
  const MlpReference r = mlp_reference(
      rig.input(), values_of(rig.params(), "blocks.0.mlp.fc.weight"), proj.to_vector(),
      std::vector<float>(static_cast<size_t>(N * D), 0.0f), N, D, c.norm_eps, true, 1.0f, v[1]);
  EXPECT_NEAR(v[0], max_abs(r.act) * 1.80 / 448.0, 2e-3 * v[0]);
  const float act_after_first = v[0];

  // The same step: the projection's scale is not taken again; the activation's is (fc grown, the
  // activation with it).
  grow_proj(2.0f);
  core::Tensor fc = rig.params().param(rig.params().index("blocks.0.mlp.fc.weight"));
  for (int64_t i = 0; i < fc.numel(); ++i)
    fc.data<float>()[i] *= 1.5f;
  rig.params().params_updated();
  rig.forward();
  EXPECT_EQ(scales.values()[1], v[1]);
  EXPECT_EQ(scales.values()[2], v[2]);
  EXPECT_GT(scales.values()[0], 2.0f * act_after_first);

  rig.ctx().want_grad = false;  // evaluation: nothing moves
  const std::vector<float> before_eval = scales.values();
  rig.forward();
  EXPECT_EQ(scales.values(), before_eval);
  rig.ctx().want_grad = true;

  scales.set_weights_step(16);  // the last bootstrapped step
  rig.forward();
  v = scales.values();
  EXPECT_EQ(v[1], fp8_scale_from_amax(proj_amax(), own));
  EXPECT_EQ(v[2], fp8_scale_from_amax(proj_amax(), next));

  scales.set_weights_step(17);  // delayed: the previous step's amax x 1.12 / 448
  const float previous_next = v[2];
  grow_proj(1.5f);
  rig.forward();
  v = scales.values();
  EXPECT_EQ(v[1], previous_next);
  EXPECT_EQ(v[2], fp8_scale_from_amax(proj_amax(), next));

  scales.set_values({0.5f, 0.25f, 0.125f});  // a checkpoint's: taken anew at the same step
  EXPECT_EQ(scales.values(), (std::vector<float>{0.5f, 0.25f, 0.125f}));
  rig.forward();
  EXPECT_EQ(scales.values()[1], 0.125f);
}

// Evaluation runs the unquantised MLP: eval_loss with model.mlp_fp8 is the loss without it bit
// for bit, while the training forward differs; the scales move only in training, and a model
// without the key holds none.
TEST(Fp8Mlp, EvaluationIsTheUnquantisedModel) {
  model::ModelConfig with = mlp_config(), without = with;
  with.n_layer = 2;
  without = with;
  without.mlp_fp8 = false;
  model::Gpt a(with, core::cpu_backend()), b(without, core::cpu_backend());
  a.init_weights();
  b.init_weights();
  // The zero-initialised projections would make both MLPs 0: draw them.
  for (model::Gpt* g : {&a, &b})
    for (size_t i = 0; i < g->table().size(); ++i) {
      if (g->table()[i].name.find("mlp.proj") == std::string::npos) continue;
      core::Tensor p = g->param(i);
      for (int64_t e = 0; e < p.numel(); ++e)
        p.data<float>()[e] = static_cast<float>(0.05 * core::rng_normal(7, e));
      g->params_updated();
    }
  std::vector<int32_t> x(32), y(32);
  for (int i = 0; i < 32; ++i)
    x[i] = (i * 7) % 64, y[i] = (i * 11 + 3) % 64;
  EXPECT_EQ(a.eval_loss(x.data(), y.data(), 2, 16), b.eval_loss(x.data(), y.data(), 2, 16));
  EXPECT_EQ(a.fp8_mlp_scales(), std::vector<float>(6, 1.0f));
  EXPECT_NE(a.forward(x.data(), y.data(), 2, 16), b.forward(x.data(), y.data(), 2, 16));
  EXPECT_NE(a.fp8_mlp_scales(), std::vector<float>(6, 1.0f));
  EXPECT_TRUE(b.fp8_mlp_scales().empty());
  EXPECT_THROW(b.set_fp8_mlp_scales({1.0f}), core::Error);
}

// The same weights (drawn, projections included, so that both GEMMs carry signal) and tokens on
// the CPU and the GPU (cuBLASLt's FP8 GEMMs with the scales as device pointers; every dimension a
// multiple of 16): two training steps' forward and backward, the second at step 20 (the delayed
// projection scale and the first forward's activation scale): the losses within 1e-3 relative and
// each gradient within 1e-2 of its norm. Both GEMMs accumulate fast on the GPU and the other
// kernels sum in other orders, which moves an FP8 operand across a rounding midpoint now and then
// (a step of 2^-4 relative in one element): a bound in norm, looser than the FP8 head's (one
// FP8 GEMM in its forward). Skipped without a device.
TEST(Fp8Mlp, ForwardAndBackwardOnTheGpuEqualTheCpu) {
  if (!core::cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::unique_ptr<core::Backend> gpu = core::make_cuda_backend(0);
  model::ModelConfig c = mlp_config();
  c.n_layer = 2;
  c.n_head = 2;
  const int B = 2, T = 16;
  model::Gpt on_cpu(c, core::cpu_backend()), on_gpu(c, *gpu);
  std::vector<float> p(static_cast<size_t>(on_cpu.params().numel()));
  for (size_t i = 0; i < on_cpu.table().size(); ++i) {
    const model::ParamInfo& info = on_cpu.table()[i];
    const double fan = info.shape.size() > 1 ? static_cast<double>(info.shape.back()) : 1.0;
    for (int64_t e = 0; e < info.numel; ++e) {
      const double z = core::rng_normal(core::rng_hash(9, i), e);
      p[static_cast<size_t>(info.offset + e)] =
          static_cast<float>(info.shape.size() > 1 ? z / std::sqrt(fan) : 0.6 + 0.4 * z);
    }
  }
  core::cpu_backend().copy_from_host(on_cpu.params().raw_data(), p.data(), p.size() * 4);
  gpu->copy_from_host(on_gpu.params().raw_data(), p.data(), p.size() * 4);
  std::vector<int32_t> x(B * T), y(B * T);
  for (int i = 0; i < B * T; ++i)
    x[i] = (i * 7 + 1) % 64, y[i] = (i * 13 + 5) % 64;
  model::Gpt* models[2] = {&on_cpu, &on_gpu};
  float loss[2];
  for (int step : {0, 20})
    for (int m = 0; m < 2; ++m) {
      models[m]->set_weights_step(step);
      models[m]->params_updated();
      models[m]->zero_grad();
      loss[m] = models[m]->forward(x.data(), y.data(), B, T);
      models[m]->backward();
    }
  EXPECT_NEAR(loss[1], loss[0], 1e-3 * std::fabs(loss[0]));
  const std::vector<float> cpu_scales = on_cpu.fp8_mlp_scales(),
                           gpu_scales = on_gpu.fp8_mlp_scales();
  for (size_t i = 0; i < cpu_scales.size(); ++i)
    EXPECT_NEAR(gpu_scales[i], cpu_scales[i], 1e-3 * cpu_scales[i]) << i;
  for (size_t i = 0; i < on_cpu.table().size(); ++i) {
    const std::vector<float> want = on_cpu.grad(i).to_vector(), got = on_gpu.grad(i).to_vector();
    double diff = 0, norm = 0;
    for (size_t e = 0; e < want.size(); ++e) {
      diff += (double(got[e]) - want[e]) * (double(got[e]) - want[e]);
      norm += double(want[e]) * want[e];
    }
    EXPECT_LE(std::sqrt(diff), 1e-2 * std::sqrt(norm)) << on_cpu.table()[i].name;
  }
}

// A tiny model (2 blocks, D = 64, V = 64) trained 60 steps by plain SGD, a fresh batch each step
// of a noisy affine sequence (x' = 5 x + 3 mod 64, a uniform token one time in 8), from the same
// weights, in fp32, bf16, and bf16 with model.mlp_fp8 (the record's precision for the MLP; the
// head unquantised): the last step's training loss and the evaluation loss of the trained weights
// on a held-out batch. The bar, the goal of issue 64: the FP8 MLP's run within bf16's own
// distance from fp32 (times 2, and at least 2e-3 relative: at this size bf16's distance is itself
// noise well below its rounding, 2^-8). Measured: fp32 0.90021 / 0.86174, bf16 0.90044 /
// 0.86150, bf16 + FP8 MLP 0.90057 / 0.86239 (train / eval): FP8 3.6e-4 and 6.5e-4 from fp32,
// bf16 2.3e-4 and 2.4e-4, both within 7.5e-4 relative.
TEST(Fp8Mlp, TrainsWithinBf16sDistanceOfFp32) {
  model::ModelConfig base;
  base.arch = model::Arch::Modern;
  base.n_layer = 2;
  base.n_head = 2;
  base.d_model = 64;
  base.seq_len = 32;
  base.vocab_size = 64;
  const int B = 4, T = 32, steps = 60;
  auto batch = [&](uint64_t seed, std::vector<int32_t>& x, std::vector<int32_t>& y) {
    x.resize(B * T), y.resize(B * T);
    core::Rng rng(seed);
    int32_t t = static_cast<int32_t>(rng.next_below(64));
    for (int i = 0; i < B * T; ++i) {
      x[i] = t;
      t = (rng.next_below(8) == 0) ? static_cast<int32_t>(rng.next_below(64)) : (5 * t + 3) % 64;
      y[i] = t;
    }
  };
  std::vector<int32_t> x, y, held_x, held_y;
  batch(1000, held_x, held_y);
  struct Run {
    const char* name;
    model::Precision precision;
    bool fp8;
    double train = 0, eval = 0;
  };
  Run runs[] = {{"fp32", model::Precision::Fp32, false},
                {"bf16", model::Precision::Bf16, false},
                {"bf16 + mlp_fp8", model::Precision::Bf16, true}};
  for (Run& run : runs) {
    model::ModelConfig c = base;
    c.precision = run.precision;
    c.mlp_fp8 = run.fp8;
    model::Gpt g(c, core::cpu_backend());
    g.init_weights();
    const int64_t n = g.params().numel();
    float* p = g.params().data<float>();
    const float* grad = g.grads().data<float>();
    for (int s = 0; s < steps; ++s) {
      g.set_weights_step(s);
      batch(static_cast<uint64_t>(s), x, y);
      g.zero_grad();
      run.train = g.forward(x.data(), y.data(), B, T);
      g.backward();
      for (int64_t i = 0; i < n; ++i)
        p[i] -= 0.2f * grad[i];
      g.params_updated();
    }
    run.eval = g.eval_loss(held_x.data(), held_y.data(), B, T);
    std::printf("[ measured ] %-15s train loss at step %d %.5f, eval loss after %.5f\n", run.name,
                steps - 1, run.train, run.eval);
  }
  for (bool eval : {false, true}) {
    auto loss = [&](const Run& r) { return eval ? r.eval : r.train; };
    const double bf16_gap = std::fabs(loss(runs[1]) - loss(runs[0]));
    const double bar = std::max(2 * bf16_gap, 2e-3 * loss(runs[0]));
    EXPECT_LE(std::fabs(loss(runs[2]) - loss(runs[0])), bar) << (eval ? "eval" : "train");
  }
  EXPECT_LT(runs[0].eval, 0.6 * std::log(64.0));  // it learned the sequence
}

}  // namespace
