// The optimizers' own device ops, CUDA against CPU (the reference): the same random inputs on
// both, results compared. Without a device every test skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "optim/adamw/adamw_ops.h"
#include "optim/muon/muon_ops.h"
#include "optim/osft/osft_ops.h"
#include "optim/soap/soap_ops.h"
#include "tests/backend_test_data.h"
#include "tests/cuda_vs_cpu.h"

namespace optim {
namespace {

using core::test::CudaVsCpu;
using test_data::random_vector;

TEST_F(CudaVsCpu, NewtonSchulz) {
  const auto cpu_muon = make_muon_ops(cpu()), gpu_muon = make_muon_ops(gpu());
  NewtonSchulzSchedule ns5;
  ns5.coefficients.assign(5, {3.4445f, -4.7750f, 2.0315f});
  for (auto [m, n, batch] : {std::tuple<int64_t, int64_t, int64_t>{8, 20, 1}, {20, 8, 2}}) {
    auto x = random_vector(batch * m * n, 1);
    auto want = x;
    cpu_muon->newton_schulz(want.data(), m, n, ns5, batch);
    float* gx = dev().upload(x);
    gpu_muon->newton_schulz(gx, m, n, ns5, batch);
    EXPECT_CLOSE(dev().download(gx, batch * m * n), want, 1e-4) << "m=" << m << " n=" << n;
  }
}

// TF32 GEMMs in the orthogonaliser (Muon's ns_tf32) against the CPU's f32: inputs rounded to 10
// mantissa bits, so agreement to about 1e-2 of the O(1) entries, not 1e-4; and not f32's result
// exactly (the flag reaches the GEMMs).
TEST_F(CudaVsCpu, NewtonSchulzOnTf32) {
  const auto cpu_muon = make_muon_ops(cpu()), gpu_muon = make_muon_ops(gpu());
  NewtonSchulzSchedule ns5 = ns5_schedule();
  const int64_t m = 96, n = 160;
  auto x = random_vector(m * n, 7);
  auto want = x;
  cpu_muon->newton_schulz(want.data(), m, n, ns5);
  ns5.tf32 = true;
  float* gx = dev().upload(x);
  gpu_muon->newton_schulz(gx, m, n, ns5);
  const auto got = dev().download(gx, m * n);
  EXPECT_CLOSE(got, want, 2e-2);
  EXPECT_NE(got, want);
}

// The record's bfloat16 iteration (ns_bf16) on the device against the CPU's, which equals
// PyTorch's bf16 run bit for bit (CpuNewtonSchulz.Bf16EqualsPyTorchsBf16Run): the GEMMs take
// bf16 values on TF32 tensor cores, whose products are exact and whose f32 sums of them mostly
// are, so the two should agree exactly; every output is a bf16 value. Square, wide, tall and a
// batch, through newton_schulz_many as Muon calls it.
TEST_F(CudaVsCpu, NewtonSchulzBf16AsTheRecord) {
  const auto cpu_muon = make_muon_ops(cpu()), gpu_muon = make_muon_ops(gpu());
  NewtonSchulzSchedule ns5 = ns5_schedule();
  ns5.bf16 = true;
  for (auto [m, n, batch] :
       {std::tuple<int64_t, int64_t, int64_t>{64, 64, 1}, {32, 96, 2}, {96, 32, 3}}) {
    auto x = random_vector(batch * m * n, 11);
    auto want = x;
    std::vector<NewtonSchulzJob> host{{want.data(), batch, m, n}};
    cpu_muon->newton_schulz_many(host, ns5);
    float* gx = dev().upload(x);
    std::vector<NewtonSchulzJob> device{{gx, batch, m, n}};
    gpu_muon->newton_schulz_many(device, ns5);
    const auto got = dev().download(gx, batch * m * n);
    for (float v : got)
      ASSERT_EQ(v, kmath::ns_round(v)) << "m=" << m << " n=" << n << ": not a bf16 value";
    // Counted rather than the vectors printed: a miss names how many and how far, in one line.
    int64_t differing = 0;
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (got[i] == want[i]) continue;
      ++differing;
      worst = std::max(worst, std::abs(static_cast<double>(got[i]) - want[i]));
    }
    EXPECT_EQ(differing, 0) << "m=" << m << " n=" << n << " batch=" << batch << ": " << differing
                            << " of " << got.size() << " values differ, by up to " << worst;
  }
}

// A step's orthogonalisations together: two jobs of one shape packed into one batched call, a
// tall one, a lone square one and an empty one, against the CPU's one call per job.
TEST_F(CudaVsCpu, NewtonSchulzManyPacksJobsOfOneShape) {
  const auto cpu_muon = make_muon_ops(cpu()), gpu_muon = make_muon_ops(gpu());
  const NewtonSchulzSchedule ns5 = ns5_schedule();
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes = {
      {1, 24, 40}, {3, 24, 40}, {2, 40, 24}, {1, 16, 16}, {0, 8, 8}};
  std::vector<std::vector<float>> x;
  std::vector<float*> gx;
  std::vector<NewtonSchulzJob> host, device;
  for (size_t k = 0; k < shapes.size(); ++k) {
    const auto [count, m, n] = shapes[k];
    x.push_back(random_vector(count * m * n, 300 + k));
    gx.push_back(count > 0 ? dev().upload(x.back()) : nullptr);
    host.push_back({x.back().data(), count, m, n});
    device.push_back({gx.back(), count, m, n});
  }
  cpu_muon->newton_schulz_many(host, ns5);
  gpu_muon->newton_schulz_many(device, ns5);
  for (size_t k = 0; k < shapes.size(); ++k) {
    if (std::get<0>(shapes[k]) > 0) {
      EXPECT_CLOSE(dev().download(gx[k], x[k].size()), x[k], 1e-4) << "job " << k;
    }
  }
}

// ---- AdamW and Muon updates ---------------------------------------------------------------------
// Muon: the same float64 element math on both devices; only FMA contraction and, for the norms,
// the order of float64 additions may differ. AdamW: the device's float form
// (kmath::adamw_element_f32) against the CPU's float64 one, a few float ulps apart.

// One launch for tensors of several sizes (empty, one element, within a chunk, several chunks)
// and their own step scalars (the eps and weight-decay modes), some with the gradient factor
// folded in (read on the device), against the CPU tensor by tensor.
TEST_F(CudaVsCpu, AdamWUpdate) {
  const auto cpu_adamw = make_adamw_ops(cpu()), gpu_adamw = make_adamw_ops(gpu());
  const std::vector<int64_t> sizes = {70001, 0, 1, 200003, 768, 65536};
  std::vector<std::vector<float>> w, m, v, g;
  std::vector<AdamWTensor> host, device;
  const float host_scale = 0.375f;
  const float* device_scale = dev().upload(std::vector<float>{host_scale});
  for (size_t k = 0; k < sizes.size(); ++k) {
    const int64_t n = sizes[k];
    const bool torch_eps = k % 2 == 1, cautious_wd = k % 4 >= 2;
    w.push_back(random_vector(n, 10 * k + 1));
    m.push_back(random_vector(n, 10 * k + 2, 0.1f));
    v.push_back(random_vector(n, 10 * k + 3, 0.1f));
    g.push_back(random_vector(n, 10 * k + 4));
    for (float& x : v.back())
      x *= x;  // a second moment is not negative
    kmath::AdamWStep step;
    step.beta1 = 0.9, step.beta2 = 0.95, step.eps = 1e-8;
    const double lr = 3e-3 * (1 + k), wd = 0.1, bc1 = 1 - 0.9 * 0.9, bc2 = 1 - 0.95 * 0.95;
    step.step_size = torch_eps ? lr / bc1 : lr * std::sqrt(bc2) / bc1;
    step.v_scale = torch_eps ? 1 / std::sqrt(bc2) : 1.0;
    step.decay = cautious_wd ? 1.0 : 1.0 - lr * wd;
    step.cautious = cautious_wd ? lr * lr * wd : 0.0;
    const bool scaled = k % 3 != 1;
    device.push_back({dev().upload(w[k]), dev().upload(m[k]), dev().upload(v[k]),
                      dev().upload(g[k]), n, step, scaled ? device_scale : nullptr});
    host.push_back({w[k].data(), m[k].data(), v[k].data(), g[k].data(), n, step,
                    scaled ? &host_scale : nullptr});
  }
  gpu_adamw->update(device);
  cpu_adamw->update(host);
  for (size_t k = 0; k < sizes.size(); ++k) {
    const size_t n = static_cast<size_t>(sizes[k]);
    EXPECT_CLOSE(dev().download(device[k].w, n), w[k], 1e-6) << "tensor " << k;
    EXPECT_CLOSE(dev().download(device[k].m, n), m[k], 1e-6) << "tensor " << k;
    EXPECT_CLOSE(dev().download(device[k].v, n), v[k], 1e-6) << "tensor " << k;
  }
}

// All parameters in one update (three launches on the GPU): tall (per-row statistics), wide
// (per-column), square and 1-row matrices, and one without normalisation, for two steps (the
// second reads the second moments of the first).
TEST_F(CudaVsCpu, MuonUpdateOfManyParameters) {
  const auto cpu_muon = make_muon_ops(cpu()), gpu_muon = make_muon_ops(gpu());
  struct Shape {
    int64_t count, rows, cols;
    bool normalize;
  };
  const std::vector<Shape> shapes = {{2, 300, 40, true}, {3, 40, 300, true},   {1, 64, 64, true},
                                     {2, 1, 9, true},    {1, 700, 300, false}, {1, 400, 200, true}};
  std::vector<std::vector<float>> w, s;
  std::vector<float*> gw, gs;
  for (size_t k = 0; k < shapes.size(); ++k) {
    const Shape& sh = shapes[k];
    w.push_back(random_vector(sh.count * sh.rows * sh.cols, 100 + k));
    s.push_back(random_vector(sh.count * std::max(sh.rows, sh.cols), 200 + k));
    for (float& x : s.back())
      x = 0.01f * x * x;
    gw.push_back(dev().upload(w.back()));
    gs.push_back(dev().upload(s.back()));
  }
  for (int t = 1; t <= 2; ++t) {
    std::vector<std::vector<float>> u;
    std::vector<float*> gu;
    std::vector<MuonUpdate> host, device;
    for (size_t k = 0; k < shapes.size(); ++k) {
      const Shape& sh = shapes[k];
      u.push_back(random_vector(sh.count * sh.rows * sh.cols, 10 * t + k));
      gu.push_back(dev().upload(u.back()));
      const double lr = 0.02 * (1 + k), wd = k % 2 == 0 ? 0.1 : 0.0;
      host.push_back({w[k].data(), u[k].data(), sh.normalize ? s[k].data() : nullptr, sh.count,
                      sh.rows, sh.cols, lr, wd});
      device.push_back(
          {gw[k], gu[k], sh.normalize ? gs[k] : nullptr, sh.count, sh.rows, sh.cols, lr, wd});
    }
    cpu_muon->update(host, 0.95);
    gpu_muon->update(device, 0.95);
    for (size_t k = 0; k < shapes.size(); ++k) {
      const std::string where = std::to_string(shapes[k].rows) + "x" +
                                std::to_string(shapes[k].cols) + " step " + std::to_string(t);
      EXPECT_CLOSE(dev().download(gu[k], u[k].size()), u[k], 1e-5) << where;
      EXPECT_CLOSE(dev().download(gs[k], s[k].size()), s[k], 1e-6) << where;
      EXPECT_CLOSE(dev().download(gw[k], w[k].size()), w[k], 1e-6) << where;
    }
  }
}

// ---- SOAP family
// ---------------------------------------------------------------------------------

TEST_F(CudaVsCpu, SoapKlWeights) {
  const auto cpu_soap = make_soap_ops(cpu()), gpu_soap = make_soap_ops(gpu());
  const int64_t n = 129;
  auto q = random_vector(n * n, 8), lam = random_vector(n, 9, 1e-3f);
  lam[0] = 0.0f;  // below eps: the weight uses eps
  std::vector<float> out(n * n);
  float* gout = dev().alloc<float>(n * n);
  gpu_soap->kl_root_weight_columns(gout, dev().upload(q), dev().upload(lam), n, 1e-4);
  cpu_soap->kl_root_weight_columns(out.data(), q.data(), lam.data(), n, 1e-4);
  EXPECT_EQ(dev().download(gout, out.size()), out);
  EXPECT_EQ(out[5 * n], q[5 * n] * static_cast<float>(std::sqrt(1.0 / n / 1e-4)));
}

TEST_F(CudaVsCpu, SoapAdam) {
  const auto cpu_soap = make_soap_ops(cpu()), gpu_soap = make_soap_ops(gpu());
  const int64_t n = 70001;
  for (int mode = 0; mode < 3; ++mode) {  // raw, corrected, corrected with Nesterov
    kmath::SoapAdamStep step;
    step.raw = mode == 0;
    step.nesterov = mode == 2;
    step.beta1 = 0.9f, step.beta2 = 0.95f;
    step.w1 = static_cast<float>(1.0 - 0.9), step.w2 = static_cast<float>(1.0 - 0.95);
    step.eps = 1e-8f;
    step.c1 = static_cast<float>(1 - 0.9 * 0.9 * 0.9);
    step.c2 = static_cast<float>(1 - 0.95 * 0.95 * 0.95);
    step.cn = static_cast<float>(1 - 0.9 * 0.9 * 0.9 * 0.9);
    auto m = random_vector(n, 14, 0.1f), v = random_vector(n, 15, 0.1f), g = random_vector(n, 16);
    for (float& e : v)
      e *= e;
    std::vector<float> d(n);
    float* gm = dev().upload(m);
    float* gv = dev().upload(v);
    float* gd = dev().alloc<float>(n);
    gpu_soap->adam(gd, gm, gv, dev().upload(g), n, step);
    cpu_soap->adam(d.data(), m.data(), v.data(), g.data(), n, step);
    EXPECT_CLOSE(dev().download(gm, n), m, 1e-6) << "mode " << mode;
    EXPECT_CLOSE(dev().download(gv, n), v, 1e-6) << "mode " << mode;
    EXPECT_CLOSE(dev().download(gd, n), d, 1e-5) << "mode " << mode;
  }
}

TEST_F(CudaVsCpu, SoapClip) {
  const auto cpu_soap = make_soap_ops(cpu()), gpu_soap = make_soap_ops(gpu());
  for (int64_t n : {int64_t{1}, int64_t{4097}, (int64_t{1} << 20) + 3}) {
    for (double max_rms : {0.5, 10.0}) {  // clipped (rms ~1), and left alone
      auto d = random_vector(n, 30 + n);
      float* gd = dev().upload(d);
      gpu_soap->clip_update_rms(gd, n, max_rms);
      cpu_soap->clip_update_rms(d.data(), n, max_rms);
      EXPECT_CLOSE(dev().download(gd, n), d, 1e-6) << "n = " << n << ", max_rms " << max_rms;
    }
  }
}

// ---- OSFT
// ----------------------------------------------------------------------------------------

// Largest |got - want| / max(1, |want|) of float64 results.
double max_rel_error_f64(const std::vector<double>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double worst = 0.0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double d = std::abs(got[i] - want[i]) / std::max(1.0, std::abs(want[i]));
    if (!(d <= worst)) worst = d;  // NaN sticks
  }
  return worst;
}

// Square, wide, tall, more rows than a block has threads (the S_low gradient's reduction), k = 1.
const std::tuple<int64_t, int64_t, int64_t> kOsftShapes[] = {
    {32, 32, 24}, {24, 64, 12}, {64, 16, 11}, {600, 40, 13}, {7, 300, 1}};

TEST_F(CudaVsCpu, OsftReconstructWholeAndRowBlock) {
  const auto cpu_osft = make_osft_ops(cpu()), gpu_osft = make_osft_ops(gpu());
  uint64_t seed = 900;
  for (auto [n, m, k] : kOsftShapes) {
    const test_data::OsftFactors f(n, m, k, seed += 10);
    const int64_t r = f.r;
    std::vector<float> w(n * m);
    cpu_osft->reconstruct(w.data(), f.u_high.data(), f.s_high.data(), f.v_high.data(),
                          f.u_low.data(), f.s_low.data(), f.v_low.data(), n, m, k, r);
    const float* uh = dev().upload(f.u_high);
    const float* sh = dev().upload(f.s_high);
    const float* vh = dev().upload(f.v_high);
    const float* ul = dev().upload(f.u_low);
    const float* sl = dev().upload(f.s_low);
    const float* vl = dev().upload(f.v_low);
    float* gw = dev().alloc<float>(n * m);
    gpu_osft->reconstruct(gw, uh, sh, vh, ul, sl, vl, n, m, k, r);
    EXPECT_CLOSE(dev().download(gw, n * m), w, 1e-6) << n << "x" << m;
    const int64_t begin = n / 3, rows = n - begin - 1;
    float* block = dev().alloc<float>(rows * m);
    gpu_osft->reconstruct(block, uh + begin * k, sh, vh, ul + begin * r, sl, vl, rows, m, k, r);
    EXPECT_CLOSE(dev().download(block, rows * m),
                 std::vector<float>(w.begin() + begin * m, w.begin() + (begin + rows) * m), 1e-6)
        << n << "x" << m;
  }
}

TEST_F(CudaVsCpu, OsftFactorGradsAccumulate) {
  const auto cpu_osft = make_osft_ops(cpu()), gpu_osft = make_osft_ops(gpu());
  uint64_t seed = 1000;
  for (auto [n, m, k] : kOsftShapes) {
    const test_data::OsftFactors f(n, m, k, seed += 10);
    const int64_t r = f.r;
    const auto dw = random_vector(n * m, seed + 7);
    auto du = random_vector(n * r, seed + 8), ds = random_vector(r, seed + 9);
    auto dv = random_vector(r * m, seed + 6);
    float* gdu = dev().upload(du);
    float* gds = dev().upload(ds);
    float* gdv = dev().upload(dv);
    const float* gdw = dev().upload(dw);
    const float* ul = dev().upload(f.u_low);
    const float* sl = dev().upload(f.s_low);
    const float* vl = dev().upload(f.v_low);
    for (int pass = 0; pass < 2; ++pass) {  // twice: the second adds to the first
      cpu_osft->factor_grads(du.data(), ds.data(), dv.data(), dw.data(), f.u_low.data(),
                             f.s_low.data(), f.v_low.data(), n, m, r);
      gpu_osft->factor_grads(gdu, gds, gdv, gdw, ul, sl, vl, n, m, r);
    }
    EXPECT_CLOSE(dev().download(gdu, n * r), du, 1e-6) << n << "x" << m;
    EXPECT_CLOSE(dev().download(gds, r), ds, 1e-6) << n << "x" << m;
    EXPECT_CLOSE(dev().download(gdv, r * m), dv, 1e-6) << n << "x" << m;
  }
}

TEST_F(CudaVsCpu, OsftProjectionsAndPartialSums) {
  const auto cpu_osft = make_osft_ops(cpu()), gpu_osft = make_osft_ops(gpu());
  uint64_t seed = 1100;
  for (auto [n, m, k] : kOsftShapes) {
    const test_data::OsftFactors f(n, m, k, seed += 10);
    const int64_t r = f.r;
    const float* uh = dev().upload(f.u_high);
    const float* vh = dev().upload(f.v_high);
    // Left: coefficients, then the update with them (the device's own coefficients, after
    // checking them, so the update is compared on equal inputs).
    auto x = random_vector(n * r, seed + 7);
    float* gx = dev().upload(x);
    std::vector<double> coeff(k * r);
    cpu_osft->left_coefficients(coeff.data(), f.u_high.data(), x.data(), n, k, r);
    double* gc = dev().alloc<double>(k * r);
    gpu_osft->left_coefficients(gc, uh, gx, n, k, r);
    EXPECT_LE(max_rel_error_f64(dev().download(gc, k * r), coeff), 1e-12) << n << "x" << m;
    gpu().copy_from_host(gc, coeff.data(), coeff.size() * sizeof(double));
    cpu_osft->project_left(x.data(), f.u_high.data(), coeff.data(), n, k, r);
    gpu_osft->project_left(gx, uh, gc, n, k, r);
    EXPECT_CLOSE(dev().download(gx, n * r), x, 1e-6) << n << "x" << m;
    // Right, in place over the rows of [r, m].
    auto y = random_vector(r * m, seed + 8);
    float* gy = dev().upload(y);
    cpu_osft->project_right(y.data(), f.v_high.data(), r, k, m);
    gpu_osft->project_right(gy, vh, r, k, m);
    EXPECT_CLOSE(dev().download(gy, r * m), y, 1e-6) << n << "x" << m;
  }
  // Partial sums add in part order on both: 1e16 + 1 - 1e16 is 0, not 1.
  const std::vector<double> partial = {1e16, 1.0, 0.5, 1.0, 2.0, 0.25, -1e16, 3.0, 0.125};
  std::vector<double> total(3);
  cpu_osft->sum_partials(total.data(), partial.data(), 3, 3);
  double* gt = dev().alloc<double>(3);
  gpu_osft->sum_partials(gt, dev().upload(partial), 3, 3);
  const std::vector<double> got = dev().download(gt, 3);
  EXPECT_EQ(got, total);
  EXPECT_EQ(got[0], 0.0);
}

}  // namespace
}  // namespace optim
