// The float CPU backend against the float64 kernels (run on the same float-rounded inputs),
// GEMM against a naive loop for every transpose / leading-dimension / batch case, results that
// do not depend on the thread count, and clear errors on bad input.
#include "core/cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/check.h"
#include "core/cpu/attention_kernels.h"
#include "core/cpu/classifier_kernels.h"
#include "core/cpu/cpu_gemm.h"
#include "core/cpu/elementwise_kernels.h"
#include "core/cpu/embedding_kernels.h"
#include "core/cpu/fast_math.h"
#include "core/cpu/gemm_kernels.h"
#include "core/cpu/moe_kernels.h"
#include "core/cpu/norm_kernels.h"
#include "core/cpu/onednn_gemm.h"
#include "grad_check.h"
#include "tests/omp_threads.h"

namespace {

using core::GemmArgs;
using core::test::expect_within;
using core::test::max_ulp_diff;
using core::test::norm_rel_diff;
using core::test::random_vec;
using core::test::to_double;
using FVec = std::vector<float>;
using DVec = std::vector<double>;
namespace cpu = core::cpu;

core::Backend& be() {
  return core::cpu_backend();
}

// Float inputs and their exact float64 copies.
struct Input {
  FVec f;
  DVec d;
  Input(int64_t n, uint64_t seed, double scale = 1.0)
      : f(random_vec<float>(n, seed, scale)), d(to_double(f)) {}
};

TEST(CpuBackend, NameAndDevice) {
  EXPECT_TRUE(be().device().is_cpu());
  EXPECT_NE(std::string(be().name()).find("OpenBLAS"), std::string::npos);
  EXPECT_NE(std::string(be().name()).find("oneDNN " + cpu::onednn_isa()), std::string::npos);
}

// The CPU's marks read the clock: a call's work is done when it returns.
TEST(CpuBackend, TimeMarksMeasureTheTimeBetweenThem) {
  const core::TimeMark a = be().mark();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const core::TimeMark b = be().mark();
  EXPECT_GE(be().elapsed_ms(a, b), 19.0);
  EXPECT_LT(be().elapsed_ms(a, b), 5000.0);
  EXPECT_EQ(be().elapsed_ms(a, a), 0.0);
}

// C = alpha op(A) op(B) + beta C against a triple loop, for every transpose combination, with
// padded leading dimensions, one matrix and a strided batch of 3 (one matrix with A transposed
// is the weight gradients' layout, which runs on OpenBLAS where oneDNN has only AVX2 kernels:
// cpu_gemm.h; ctest runs this again with each library forced).
TEST(CpuBackend, GemmAllLayoutsAgainstNaive) {
  const int64_t m = 5, n = 7, k = 9, pad = 3;
  for (int64_t batch : {1, 3})
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        GemmArgs g;
        g.trans_a = ta, g.trans_b = tb, g.m = m, g.n = n, g.k = k;
        g.alpha = 0.75f, g.beta = 1.0f;
        g.lda = (ta ? m : k) + pad, g.ldb = (tb ? k : n) + pad, g.ldc = n + pad;
        int64_t a_rows = ta ? k : m, b_rows = tb ? n : k;
        g.batch = batch;
        g.stride_a = a_rows * g.lda + 1, g.stride_b = b_rows * g.ldb + 2, g.stride_c = m * g.ldc;
        Input a(batch * g.stride_a, 1), b(batch * g.stride_b, 2), c(batch * g.stride_c, 3);
        FVec out = c.f;
        be().gemm(g, a.f.data(), b.f.data(), out.data());
        DVec expect = c.d;
        for (int64_t p = 0; p < batch; ++p) {
          const double* A = a.d.data() + p * g.stride_a;
          const double* B = b.d.data() + p * g.stride_b;
          for (int64_t i = 0; i < m; ++i) {
            for (int64_t j = 0; j < n; ++j) {
              double s = 0.0;
              for (int64_t l = 0; l < k; ++l) {
                s += (ta ? A[l * g.lda + i] : A[i * g.lda + l]) *
                     (tb ? B[j * g.ldb + l] : B[l * g.ldb + j]);
              }
              expect[p * g.stride_c + i * g.ldc + j] += 0.75 * s;
            }
          }
        }
        // measured 4.5e-8 .. 5.5e-8
        expect_within("gemm batch=" + std::to_string(batch) + " trans_a=" + std::to_string(ta) +
                          " trans_b=" + std::to_string(tb) + ", norm-relative",
                      norm_rel_diff(out, expect), 2e-7);
      }
    }
}

// A batch of 16 small GEMMs (one oneDNN matmul) equals 16 separate calls, to rounding: oneDNN may
// split a member over the threads when they do not divide the batch (its AVX2 kernel at 3
// threads: 18 of 1920 values a last bit apart, measured on a Zen 2; bit for bit at 1, 2 and 4).
TEST(CpuBackend, GemmBatchEqualsOneCallPerMember) {
  const int64_t m = 12, n = 10, k = 8, batch = 16;
  Input a(batch * m * k, 4), b(batch * k * n, 5);
  GemmArgs g;
  g.m = m, g.n = n, g.k = k, g.batch = batch;
  g.stride_a = m * k, g.stride_b = k * n, g.stride_c = m * n;
  FVec all(batch * m * n), one(batch * m * n);
  be().gemm(g, a.f.data(), b.f.data(), all.data());
  GemmArgs s = g;
  s.batch = 1;
  for (int64_t p = 0; p < batch; ++p)
    be().gemm(s, a.f.data() + p * m * k, b.f.data() + p * k * n, one.data() + p * m * n);
  // measured 0 (1, 2, 4 threads), 8.9e-9 (3), 1.6e-8 (5)
  expect_within("batched against one call per member, norm-relative", norm_rel_diff(all, one),
                2e-7);
}

// One long inner dimension (the classifier's dx: k = the padded vocabulary), where a GEMM may
// split k across threads and add the parts, against float64.
TEST(CpuBackend, GemmLongInnerDimensionAgainstNaive) {
  const int64_t m = 24, n = 16, k = 50304;
  Input a(m * k, 11), b(k * n, 12);
  GemmArgs g;
  g.m = m, g.n = n, g.k = k;
  FVec out(m * n);
  be().gemm(g, a.f.data(), b.f.data(), out.data());
  DVec expect(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t l = 0; l < k; ++l)
      for (int64_t j = 0; j < n; ++j)
        expect[i * n + j] += a.d[i * k + l] * b.d[l * n + j];
  // measured 6.2e-7 (1 and 2 threads); one f32 sum in order would drift as sqrt(k) eps, 1.3e-5
  expect_within("gemm k=50304, norm-relative", norm_rel_diff(out, expect), 2e-6);
}

// The long inner dimension summed in chunks (onednn_gemm.cpp: k >= 16384 and 8 m, 8 n), for every
// transpose combination with padded leading dimensions, alpha and an accumulating beta, k not a
// multiple of the chunk; f32 operands, and bf16 operands with an f32 C, against float64 of the
// same values.
TEST(CpuBackend, GemmLongInnerDimensionInChunksAllLayoutsAgainstNaive) {
  const int64_t m = 6, n = 5, k = 20011, pad = 3;
  for (bool bf16_in : {false, true}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        GemmArgs g;
        g.trans_a = ta, g.trans_b = tb, g.m = m, g.n = n, g.k = k;
        g.alpha = 0.5f, g.beta = 0.75f;
        g.lda = (ta ? m : k) + pad, g.ldb = (tb ? k : n) + pad, g.ldc = n + pad;
        Input a((ta ? k : m) * g.lda, 31), b((tb ? n : k) * g.ldb, 32), c(m * g.ldc, 33);
        FVec out = c.f;
        if (bf16_in) {  // the values a bf16 operand holds, in the float64 reference too
          for (Input* x : {&a, &b})
            for (size_t i = 0; i < x->f.size(); ++i)
              x->d[i] = x->f[i] =
                  core::kmath::float_from_bf16(core::kmath::bf16_from_float(x->f[i]));
          std::vector<core::bf16> ab(a.f.size()), bb(b.f.size());
          for (size_t i = 0; i < ab.size(); ++i)
            ab[i] = core::kmath::bf16_from_float(a.f[i]);
          for (size_t i = 0; i < bb.size(); ++i)
            bb[i] = core::kmath::bf16_from_float(b.f[i]);
          be().gemm(g, ab.data(), bb.data(), out.data());
        } else {
          be().gemm(g, a.f.data(), b.f.data(), out.data());
        }
        DVec expect = c.d;
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            double sum = 0.0;
            for (int64_t l = 0; l < k; ++l)
              sum += (ta ? a.d[l * g.lda + i] : a.d[i * g.lda + l]) *
                     (tb ? b.d[j * g.ldb + l] : b.d[l * g.ldb + j]);
            expect[i * g.ldc + j] = 0.75 * c.d[i * g.ldc + j] + 0.5 * sum;
          }
        }
        // oneDNN's matmul sums k in the backend's chunks: measured 1.1e-7 .. 4.9e-7. The weight
        // gradients' layout where it runs on OpenBLAS (cpu_gemm.h) is one sgemm over all of k,
        // whose f32 rounding grows as sqrt(k) u (8.4e-6 at k = 20011): measured 2.7e-6 on the
        // SkylakeX kernels (Intel Xeon with AMX, 2026-12-07), below 2e-6 on a Zen 2's Haswell
        // ones. A lost or repeated chunk would be off by 1 / chunks, far above either bar.
        const bool on_openblas = !bf16_in && ta && !tb && core::cpu::f32_trans_a_on_openblas();
        expect_within(std::string(bf16_in ? "bf16" : "f32") + " gemm k=20011 trans_a=" +
                          std::to_string(ta) + " trans_b=" + std::to_string(tb) + ", norm-relative",
                      norm_rel_diff(out, expect), on_openblas ? 1e-5 : 2e-6);
      }
    }
  }
}

// The chunks depend on k alone, so the f32 sum does not depend on the thread count where oneDNN
// does not split a chunk's k over the threads itself: at the model's sides (the classifier's d x:
// m = 128 .. 1024 tokens, n = d_model 128 .. 512), for every transpose combination. Thin products
// are split on some kernels: oneDNN 2.6's AVX2 f32 GEMM differs between 1 and 2 threads at m x n
// 6 x 5 .. 64 x 48 (k 8192, measured on a Zen 2), its bf16 kernels on AVX-512 at 6 x 5 too. Where
// the weight gradients' layout (A transposed, B not) runs on OpenBLAS (cpu_gemm.h), that layout
// is left out: OpenBLAS splits C's rows over the threads, and rows past a multiple of its kernel's
// unroll (24 on a Zen 2) take its edge kernel, which sums in another order; the ctest
// gemm_trans_a_on_onednn runs it on oneDNN.
TEST(CpuBackend, GemmLongInnerDimensionInChunksDoesNotDependOnTheThreadCount) {
  const int64_t m = 128, n = 128, k = 20011;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      if (ta && !tb && core::cpu::f32_trans_a_on_openblas()) continue;
      GemmArgs g;
      g.trans_a = ta, g.trans_b = tb, g.m = m, g.n = n, g.k = k;
      g.lda = ta ? m : k, g.ldb = tb ? k : n;
      Input a(m * k, 34), b(k * n, 35);
      auto product = [&](int threads) {
        FVec out(m * n);
        test_util::OmpThreads at(threads);
        be().gemm(g, a.f.data(), b.f.data(), out.data());
        return out;
      };
      EXPECT_EQ(product(2), product(1)) << "f32 gemm k=20011 trans_a=" << ta << " trans_b=" << tb
                                        << ": the sum depends on the threads";
    }
  }
}

// GEMMs called from several threads at once (each thread its own shapes, and one shape shared by
// all) give the bits they give one at a time: each thread executes on its own stream and
// scratchpad (onednn_gemm.h).
TEST(CpuBackend, GemmFromSeveralThreadsAtOnceEqualsOneAtATime) {
  constexpr int kThreads = 4;
  struct Job {
    GemmArgs g;
    Input a, b;
    FVec alone, together;
  };
  std::vector<Job> jobs;
  for (int t = 0; t < 2 * kThreads; ++t) {
    // Even jobs share one shape; odd ones have a shape of their own, k long enough to be split.
    const int64_t m = t % 2 ? 32 + t : 48, n = t % 2 ? 24 + t : 40, k = t % 2 ? 4096 + t : 256;
    GemmArgs g;
    g.m = m, g.n = n, g.k = k;
    jobs.push_back({g, Input(m * k, 20 + t), Input(k * n, 40 + t), FVec(m * n), FVec(m * n)});
  }
  for (Job& j : jobs)
    be().gemm(j.g, j.a.f.data(), j.b.f.data(), j.alone.data());
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&jobs, t] {
      for (int rep = 0; rep < 20; ++rep) {
        for (size_t i = t; i < jobs.size(); i += kThreads) {
          Job& j = jobs[i];
          be().gemm(j.g, j.a.f.data(), j.b.f.data(), j.together.data());
        }
      }
    });
  }
  for (std::thread& th : threads)
    th.join();
  for (size_t i = 0; i < jobs.size(); ++i)
    EXPECT_EQ(jobs[i].together, jobs[i].alone) << "job " << i;
}

// An empty inner dimension (a rank holding no rows of a shard) scales C by beta.
TEST(CpuBackend, GemmWithEmptyInnerDimensionScalesByBeta) {
  GemmArgs g;
  g.trans_a = true;
  g.m = 2, g.n = 3, g.k = 0, g.beta = 1.0f;
  FVec c = {1, 2, 3, 4, 5, 6}, keep = c;
  const float* none = nullptr;
  be().gemm(g, none, none, c.data());
  EXPECT_EQ(c, keep);
  g.beta = 0.0f;
  be().gemm(g, none, none, c.data());
  EXPECT_EQ(c, FVec(6, 0.0f));
}

TEST(CpuBackend, GemmRejectsBadLeadingDimension) {
  GemmArgs g;
  g.m = 4, g.n = 4, g.k = 4, g.lda = 3;
  FVec a(16), b(16), c(16);
  try {
    be().gemm(g, a.data(), b.data(), c.data());
    FAIL() << "no error";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("lda 3 < 4"), std::string::npos) << e.what();
  }
}

// Every op starts from float inputs and their exact float64 copies, so a correctly rounded
// result is within 0.5 ulp of the float64 one: ulp is the measure for single-rounding ops.
TEST(CpuBackend, ElementwiseOpsMatchFloat64) {
  const int64_t n = 100003;  // above the parallel threshold, odd
  Input a(n, 10, 2.0), b(n, 11), g(n, 12);
  FVec out(n);
  DVec ref(n);
  be().add(out.data(), a.f.data(), b.f.data(), n);
  cpu::add(ref.data(), a.d.data(), b.d.data(), n);
  expect_within("add, ulp", max_ulp_diff(out, ref), 1.0);  // measured 0.5 (correctly rounded)
  out = b.f, ref = b.d;
  be().axpby(out.data(), 0.5f, a.f.data(), -2.0f, n);
  cpu::axpby(ref.data(), 0.5, a.d.data(), -2.0, n);
  expect_within("axpby, ulp", max_ulp_diff(out, ref), 1.0);  // measured 0.5 (exact products)
  out = b.f, ref = b.d;
  be().scale(out.data(), 3.0f, n);
  cpu::scale(ref.data(), 3.0, n);
  expect_within("scale, ulp", max_ulp_diff(out, ref), 1.0);  // measured 0.5
  {  // scale_many: each tensor as scale() leaves it, an empty one included
    FVec first = b.f, second(b.f.begin(), b.f.begin() + 37), want_first = b.f, want_second = second;
    const std::vector<std::span<float>> list = {first, {}, second};
    be().scale_many(list, -0.75f);
    be().scale(want_first.data(), -0.75f, n);
    be().scale(want_second.data(), -0.75f, 37);
    EXPECT_EQ(first, want_first);
    EXPECT_EQ(second, want_second);
  }
  be().relu2_forward(out.data(), a.f.data(), n);
  cpu::relu2_forward(ref.data(), a.d.data(), n);
  expect_within("relu2_forward, ulp", max_ulp_diff(out, ref), 1.0);  // measured 0.5
  // Into a zero buffer (the accumulation is checked in float64 by kernel_grad_test).
  FVec dinp(n, 0.0f);
  DVec dref(n, 0.0);
  be().relu2_backward(dinp.data(), a.f.data(), g.f.data(), n);
  cpu::relu2_backward(dref.data(), a.d.data(), g.d.data(), n);
  expect_within("relu2_backward, ulp", max_ulp_diff(dinp, dref), 1.0);  // measured 0.5
  // GELU's tanh form cancels in 1 + tanh(.) for x << 0, where gelu(x) is tiny: its float error
  // is relative to |x|, not to the result (1.7e7 ulp there), so the measure is norm-relative.
  be().gelu_forward(out.data(), a.f.data(), n);
  cpu::gelu_forward(ref.data(), a.d.data(), n);
  // measured 3.4e-8
  expect_within("gelu_forward, norm-relative", norm_rel_diff(out, ref), 3e-7);
  dinp.assign(n, 0.0f);
  dref.assign(n, 0.0);
  be().gelu_backward(dinp.data(), a.f.data(), g.f.data(), n);
  cpu::gelu_backward(dref.data(), a.d.data(), g.d.data(), n);
  // measured 9.9e-8
  expect_within("gelu_backward, norm-relative", norm_rel_diff(dinp, dref), 5e-7);
  be().gelu_erf_forward(out.data(), a.f.data(), n);
  cpu::gelu_erf_forward(ref.data(), a.d.data(), n);
  expect_within("gelu_erf_forward, norm-relative", norm_rel_diff(out, ref), 3e-7);
  dinp.assign(n, 0.0f);
  dref.assign(n, 0.0);
  be().gelu_erf_backward(dinp.data(), a.f.data(), g.f.data(), n);
  cpu::gelu_erf_backward(dref.data(), a.d.data(), g.d.data(), n);
  expect_within("gelu_erf_backward, norm-relative", norm_rel_diff(dinp, dref), 5e-7);
  double ss = 0.0;
  for (double x : a.d)
    ss += x * x;
  // float64 accumulation of float squares: measured 5.3e-14
  expect_within("sum_squares, relative", std::abs(be().sum_squares(a.f.data(), n) - ss) / ss,
                5e-13);
}

TEST(CpuBackend, NormsAndSoftmaxMatchFloat64) {
  const int64_t N = 37, C = 768;
  Input x(N * C, 20, 3.0), w(C, 21), b(C, 22), g(N * C, 23);
  FVec out(N * C), mean(N), rstd(N), dx(N * C), dw(C), db(C);
  DVec rout(N * C), rmean(N), rrstd(N), rdx(N * C), rdw(C), rdb(C);
  be().layernorm_forward(out.data(), mean.data(), rstd.data(), x.f.data(), w.f.data(), b.f.data(),
                         N, C, 1e-5f);
  cpu::layernorm_forward(rout.data(), rmean.data(), rrstd.data(), x.d.data(), w.d.data(),
                         b.d.data(), N, C, 1e-5);
  // measured 1.5e-7
  expect_within("layernorm_forward out, norm-relative", norm_rel_diff(out, rout), 1e-6);
  // measured 2.0e-7
  expect_within("layernorm_forward rstd, norm-relative", norm_rel_diff(rstd, rrstd), 1e-6);
  be().layernorm_backward(dx.data(), dw.data(), db.data(), g.f.data(), x.f.data(), w.f.data(),
                          mean.data(), rstd.data(), N, C);
  cpu::layernorm_backward(rdx.data(), rdw.data(), rdb.data(), g.d.data(), x.d.data(), w.d.data(),
                          rmean.data(), rrstd.data(), N, C);
  // measured 2.1e-7
  expect_within("layernorm_backward dx, norm-relative", norm_rel_diff(dx, rdx), 1e-6);
  // measured 2.4e-7
  expect_within("layernorm_backward dw, norm-relative", norm_rel_diff(dw, rdw), 1e-6);
  // measured 1.2e-7
  expect_within("layernorm_backward db, norm-relative", norm_rel_diff(db, rdb), 1e-6);

  be().rmsnorm_forward(out.data(), rstd.data(), x.f.data(), N, C, 1e-6f);
  cpu::rmsnorm_forward(rout.data(), rrstd.data(), x.d.data(), N, C, 1e-6);
  // measured 2.0e-7
  expect_within("rmsnorm_forward out, norm-relative", norm_rel_diff(out, rout), 1e-6);
  be().rmsnorm_backward(dx.data(), g.f.data(), x.f.data(), rstd.data(), N, C);
  cpu::rmsnorm_backward(rdx.data(), g.d.data(), x.d.data(), rrstd.data(), N, C);
  // measured 2.0e-7
  expect_within("rmsnorm_backward dx, norm-relative", norm_rel_diff(dx, rdx), 1e-6);

  be().softmax_forward(out.data(), x.f.data(), N, C);
  cpu::softmax_forward(rout.data(), x.d.data(), N, C);
  // measured 1.1e-7
  expect_within("softmax_forward out, norm-relative", norm_rel_diff(out, rout), 1e-6);
  be().softmax_backward(dx.data(), g.f.data(), out.data(), N, C);
  cpu::softmax_backward(rdx.data(), g.d.data(), rout.data(), N, C);
  // measured 2.0e-7
  expect_within("softmax_backward dx, norm-relative", norm_rel_diff(dx, rdx), 1e-6);
}

// A zero-variance row stays finite thanks to eps inside the square root.
TEST(CpuBackend, NormsOfConstantRowsAreFinite) {
  const int64_t C = 16;
  FVec x(C, 2.5f), out(C), mean(1), rstd(1);
  be().layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), nullptr, nullptr, 1, C,
                         1e-5f);
  EXPECT_FLOAT_EQ(rstd[0], 1.0f / std::sqrt(1e-5f));
  for (float v : out)
    EXPECT_EQ(v, 0.0f);
  FVec zero(C, 0.0f);
  be().rmsnorm_forward(out.data(), rstd.data(), zero.data(), 1, C, 1e-6f);
  EXPECT_FLOAT_EQ(rstd[0], 1.0f / std::sqrt(1e-6f));
}

TEST(CpuBackend, AttentionPathMatchesFloat64) {
  const int64_t B = 2, T = 97, H = 3, hd = 16, BH = B * H, D = H * hd, n = BH * T * hd;
  Input qkv(B * T * 3 * D, 30), g(B * T * D, 31);
  float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Float backend: split, rotary on q and k, attention, merge; then the whole backward.
  FVec q(n), k(n), v(n), lse(BH * T), a(n), out(B * T * D);
  be().split_heads(q.data(), k.data(), v.data(), qkv.f.data(), B, T, H, hd);
  be().rotary_forward(q.data(), q.data(), BH, T, hd, 10000.0f);
  be().rotary_forward(k.data(), k.data(), BH, T, hd, 10000.0f);
  be().attention_forward(a.data(), lse.data(), q.data(), k.data(), v.data(), BH, T, hd, scale);
  be().merge_heads(out.data(), a.data(), B, T, H, hd);
  FVec da(n), dq(n), dk(n), dv(n), dqr(n), dkr(n), dqkv(B * T * 3 * D);
  be().merge_heads_backward(da.data(), g.f.data(), B, T, H, hd);
  be().attention_backward(dq.data(), dk.data(), dv.data(), da.data(), a.data(), lse.data(),
                          q.data(), k.data(), v.data(), BH, T, hd, scale);
  be().rotary_backward(dqr.data(), dq.data(), BH, T, hd, 10000.0f);
  be().rotary_backward(dkr.data(), dk.data(), BH, T, hd, 10000.0f);
  be().split_heads_backward(dqkv.data(), dqr.data(), dkr.data(), dv.data(), B, T, H, hd);

  DVec rq(n), rk(n), rv(n), rlse(BH * T), ra(n), rout(B * T * D);
  cpu::split_heads(rq.data(), rk.data(), rv.data(), qkv.d.data(), B, T, H, hd);
  cpu::rotary_forward(rq.data(), rq.data(), BH, T, hd, 10000.0);
  cpu::rotary_forward(rk.data(), rk.data(), BH, T, hd, 10000.0);
  cpu::attention_forward(ra.data(), rlse.data(), rq.data(), rk.data(), rv.data(), BH, T, hd,
                         static_cast<double>(scale));
  cpu::merge_heads(rout.data(), ra.data(), B, T, H, hd);
  DVec rda(n), rdq(n), rdk(n), rdv(n), rdqr(n), rdkr(n), rdqkv(B * T * 3 * D);
  cpu::merge_heads_backward(rda.data(), g.d.data(), B, T, H, hd);
  cpu::attention_backward(rdq.data(), rdk.data(), rdv.data(), rda.data(), ra.data(), rlse.data(),
                          rq.data(), rk.data(), rv.data(), BH, T, hd, static_cast<double>(scale));
  cpu::rotary_backward(rdqr.data(), rdq.data(), BH, T, hd, 10000.0);
  cpu::rotary_backward(rdkr.data(), rdk.data(), BH, T, hd, 10000.0);
  cpu::split_heads_backward(rdqkv.data(), rdqr.data(), rdkr.data(), rdv.data(), B, T, H, hd);

  // measured 1.9e-7
  expect_within("attention path out, norm-relative", norm_rel_diff(out, rout), 1e-6);
  // measured 4.1e-8
  expect_within("attention path lse, norm-relative", norm_rel_diff(lse, rlse), 1e-6);
  // measured 2.6e-7
  expect_within("attention path dqkv, norm-relative", norm_rel_diff(dqkv, rdqkv), 1e-6);
}

// GPT-2's attention in the model's layout (q, k, v read strided from qkv, out written as
// [B, T, H hd], d q, k, v written into d qkv over noise) against the heads split, attention on
// packed heads, merged, and the gradients split back: the same GEMMs on the same numbers, so the
// same bits. Masked and not, with more heads than threads and fewer.
TEST(CpuBackend, StridedQkvAttentionEqualsSplitAndMergeBitForBit) {
  using L = core::AttentionLayout;
  for (int64_t H : {1, 12}) {
    for (bool masked : {false, true}) {
      const int64_t B = 2, T = 97, hd = 16, BH = B * H, D = H * hd, N = B * T, n = N * D;
      std::vector<int32_t> begin(static_cast<size_t>(B * T));
      for (int64_t i = 0; i < B * T; ++i)
        begin[i] = static_cast<int32_t>(std::max<int64_t>(i % T >= 40 ? 40 : 0, i % T - 30));
      const core::AttentionMask mask{masked ? begin.data() : nullptr, H};
      Input qkv(N * 3 * D, 40), g(n, 41);
      const float scale = 0.25f;
      FVec q(n), k(n), v(n), lse(BH * T), a(n), out(n), da(n, 0.0f), dq(n), dk(n), dv(n);
      FVec dqkv(N * 3 * D, 0.0f);
      be().split_heads(q.data(), k.data(), v.data(), qkv.f.data(), B, T, H, hd);
      be().attention_forward(a.data(), lse.data(), q.data(), k.data(), v.data(), BH, T, hd, scale,
                             mask);
      be().merge_heads(out.data(), a.data(), B, T, H, hd);
      be().merge_heads_backward(da.data(), g.f.data(), B, T, H, hd);
      be().attention_backward(dq.data(), dk.data(), dv.data(), da.data(), a.data(), lse.data(),
                              q.data(), k.data(), v.data(), BH, T, hd, scale, mask);
      be().split_heads_backward(dqkv.data(), dq.data(), dk.data(), dv.data(), B, T, H, hd);

      const core::HeadStrides in = L::token_rows(T, hd, 3 * D);
      const core::AttentionLayout layout{H, in, in, in, L::token_rows(T, hd, D)};
      const float* x = qkv.f.data();
      FVec s_out(n), s_lse(BH * T), s_dqkv = random_vec<float>(N * 3 * D, 42);
      float* d = s_dqkv.data();
      be().attention_forward(s_out.data(), s_lse.data(), x, x + D, x + 2 * D, BH, T, hd, scale,
                             mask, false, layout);
      be().attention_backward(d, d + D, d + 2 * D, g.f.data(), s_out.data(), s_lse.data(), x, x + D,
                              x + 2 * D, BH, T, hd, scale, mask, false, layout);
      SCOPED_TRACE("H " + std::to_string(H) + (masked ? " masked" : ""));
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(s_out[i], out[i]) << "out " << i;
      for (int64_t i = 0; i < BH * T; ++i)
        ASSERT_EQ(s_lse[i], lse[i]) << "lse " << i;
      for (int64_t i = 0; i < N * 3 * D; ++i)
        ASSERT_EQ(s_dqkv[i], dqkv[i]) << "d qkv " << i;
    }
  }
}

TEST(CpuBackend, EmbeddingBiasGatherMatchFloat64) {
  const int64_t B = 3, T = 11, D = 70, V = 29, N = B * T;
  std::vector<int32_t> tok(N);
  for (int64_t i = 0; i < N; ++i)
    tok[i] = static_cast<int32_t>((i * i + 3) % V);
  Input wte(V * D, 40), wpe(T * D, 41), g(N * D, 42), bias(D, 43), w(N, 44);
  FVec out(N * D), dte(V * D), dpe(T * D), db(D), rows(N * D), dots(N);
  DVec rout(N * D), rdte(V * D), rdpe(T * D), rdb(D), rrows(N * D), rdots(N);
  be().embedding_forward(out.data(), tok.data(), wte.f.data(), wpe.f.data(), B, T, D);
  cpu::embedding_forward(rout.data(), tok.data(), wte.d.data(), wpe.d.data(), B, T, D);
  // measured 0.5 ulp
  expect_within("embedding_forward out, ulp", max_ulp_diff(out, rout), 1.0);
  be().embedding_backward(dte.data(), dpe.data(), g.f.data(), tok.data(), B, T, D);
  cpu::embedding_backward(rdte.data(), rdpe.data(), g.d.data(), tok.data(), B, T, D);
  // measured 3.1e-8
  expect_within("embedding_backward dte, norm-relative", norm_rel_diff(dte, rdte), 2e-7);
  // measured 3.6e-8
  expect_within("embedding_backward dpe, norm-relative", norm_rel_diff(dpe, rdpe), 2e-7);
  rout = to_double(out);  // add_bias from the same float inputs: one rounding
  be().add_bias(out.data(), bias.f.data(), N, D);
  cpu::add_bias(rout.data(), bias.d.data(), N, D);
  // measured 0.5 ulp
  expect_within("add_bias out, ulp", max_ulp_diff(out, rout), 1.0);
  be().bias_backward(db.data(), g.f.data(), N, D);
  cpu::bias_backward(rdb.data(), g.d.data(), N, D);
  // measured 1.2e-7
  expect_within("bias_backward db, norm-relative", norm_rel_diff(db, rdb), 5e-7);
  be().gather_rows(rows.data(), wte.f.data(), tok.data(), w.f.data(), N, D);
  cpu::gather_rows(rrows.data(), wte.d.data(), tok.data(), w.d.data(), N, D);
  // measured 0.5 ulp
  expect_within("gather_rows rows, ulp", max_ulp_diff(rows, rrows), 1.0);
  be().scatter_add_rows(dte.data(), g.f.data(), tok.data(), w.f.data(), N, D);
  cpu::scatter_add_rows(rdte.data(), g.d.data(), tok.data(), w.d.data(), N, D);
  // measured 4.1e-8
  expect_within("scatter_add_rows dte, norm-relative", norm_rel_diff(dte, rdte), 2e-7);
  be().row_dot(dots.data(), rows.data(), g.f.data(), N, D);
  cpu::row_dot(rdots.data(), rrows.data(), g.d.data(), N, D);
  // measured 1.5e-7
  expect_within("row_dot dots, norm-relative", norm_rel_diff(dots, rdots), 5e-7);
}

TEST(CpuBackend, CrossEntropyMatchesFloat64AndZeroesPadding) {
  const int64_t N = 19, V = 1000, Vp = 1024;
  Input logits(N * Vp, 50, 4.0);
  std::vector<int32_t> tgt(N);
  for (int64_t i = 0; i < N; ++i)
    tgt[i] = static_cast<int32_t>((i * 97) % V);
  for (float cap : {0.0f, 15.0f}) {
    FVec loss(N), d(N * Vp, 1.0f);
    DVec rloss(N), rd(N * Vp);
    be().cross_entropy(loss.data(), d.data(), logits.f.data(), tgt.data(), N, V, Vp, cap, 1.0f / N);
    cpu::cross_entropy(rloss.data(), rd.data(), logits.d.data(), tgt.data(), N, V, Vp,
                       static_cast<double>(cap), 1.0 / N);
    // Bars from the float32 rounding (u = 2^-24) of the computation, for any summation order
    // (Release vectorises the sum s of V exponentials; -O2 builds add them one by one: measured
    // 7.9e-8 and 7.8e-7 on the gradient). Taking its V - 1 roundings as independent, the
    // relative error of s stays below lambda sqrt(V) u with probability at least
    // 1 - 2 V exp(-lambda^2 / 2) (Higham and Mary 2019, theorem 3.1): 1 - 3e-5 for lambda = 6.
    // The worst case, (V - 1) u = 6e-5, needs every rounding to go the same way.
    // d = e^(z - max) / s: every entry takes s's error, plus its own roundings (softcap, exp's
    // argument and polynomial, 1 / s, three products): at most 16 u.
    const double u = std::ldexp(1.0, -24);
    const double sum_error = 6.0 * std::sqrt(static_cast<double>(V)) * u;
    expect_within("cross_entropy d, norm-relative", norm_rel_diff(d, rd), sum_error + 16 * u);
    // The loss max + log(s) - z_t: log turns s's relative error into an absolute one, and four
    // roundings (z_t, log, two sums) of values up to the largest |log-sum-exp| add theirs;
    // relative to the smallest loss.
    double lse_max = 0, loss_min = INFINITY;
    for (int64_t i = 0; i < N; ++i) {
      const double x = logits.d[static_cast<size_t>(i * Vp + tgt[i])];
      const double z = cap > 0 ? cap * std::tanh(x / cap) : x;
      lse_max = std::max(lse_max, std::fabs(rloss[i] + z));
      loss_min = std::min(loss_min, rloss[i]);
    }
    expect_within("cross_entropy loss, norm-relative", norm_rel_diff(loss, rloss),
                  (sum_error + 4 * u * lse_max) / loss_min);
    for (int64_t i = 0; i < N; ++i) {
      for (int64_t j = V; j < Vp; ++j)
        ASSERT_EQ(d[i * Vp + j], 0.0f);
    }
  }
}

TEST(CpuBackend, CrossEntropyRejectsTargetOutsideVocabulary) {
  FVec logits(2 * 8), loss(2);
  std::vector<int32_t> tgt = {1, 6};  // V = 6: column 6 is padding
  try {
    be().cross_entropy(loss.data(), nullptr, logits.data(), tgt.data(), 2, 6, 8, 0.0f, 1.0f);
    FAIL() << "no error";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("target 6 at row 1"), std::string::npos) << e.what();
  }
}

TEST(CpuBackend, EmbeddingRejectsNegativeToken) {
  FVec wte(4 * 3), out(2 * 3);
  std::vector<int32_t> tok = {0, -2};
  EXPECT_THROW(be().embedding_forward(out.data(), tok.data(), wte.data(), nullptr, 1, 2, 3),
               core::Error);
}

TEST(CpuBackend, RotaryRejectsOddHeadDim) {
  FVec x(3 * 5);
  EXPECT_THROW(be().rotary_forward(x.data(), x.data(), 1, 3, 5, 10000.0f), core::Error);
}

// Row reductions use fixed blocks: 1 thread and 2 threads give bit-identical gradients.
TEST(CpuBackend, ReductionsDoNotDependOnThreadCount) {
  const int64_t N = 1000, C = 96, V = 50;
  Input x(N * C, 60), g(N * C, 61), w(C, 62);
  std::vector<int32_t> tok(N);
  for (int64_t i = 0; i < N; ++i)
    tok[i] = static_cast<int32_t>((i * 13) % V);
  FVec mean(N), rstd(N), out(N * C);
  be().layernorm_forward(out.data(), mean.data(), rstd.data(), x.f.data(), w.f.data(), nullptr, N,
                         C, 1e-5f);
  auto run = [&](int threads) {
    FVec db(C), dw(C), dbl(C), dte(V * C);
    double ss = 0;
    {
      test_util::OmpThreads at(threads);
      be().bias_backward(db.data(), g.f.data(), N, C);
      be().layernorm_backward(nullptr, dw.data(), dbl.data(), g.f.data(), x.f.data(), w.f.data(),
                              mean.data(), rstd.data(), N, C);
      be().embedding_backward(dte.data(), nullptr, g.f.data(), tok.data(), 1, N, C);
      ss = be().sum_squares(g.f.data(), N * C);
    }
    FVec all = db;
    all.insert(all.end(), dw.begin(), dw.end());
    all.insert(all.end(), dbl.begin(), dbl.end());
    all.insert(all.end(), dte.begin(), dte.end());
    all.push_back(static_cast<float>(ss));
    return all;
  };
  EXPECT_EQ(run(1), run(2));
}

}  // namespace

namespace {

// The vectorisable float exp/tanh of the CPU kernels against the float64 library functions.
TEST(CpuFastMath, ExpAndTanhAccuracyAndSpecialValues) {
  using core::cpu::FastMath;
  core::Difference exp_err, tanh_err;  // NaN-proof: a NaN result is an infinite error
  for (int i = 0; i <= 400000; ++i) {
    float x = -87.0f + 175.0f * static_cast<float>(i) / 400000.0f;
    exp_err.add(FastMath::exp(x), std::exp(static_cast<double>(x)));
    float t = -10.0f + 20.0f * static_cast<float>(i) / 400000.0f;
    tanh_err.add(FastMath::tanh(t), std::tanh(static_cast<double>(t)));
  }
  // measured 0.98 ulp
  expect_within("fast exp, ulp of the float64 result", exp_err.max_ulp(), 2.0);
  // measured 1.28 ulp
  expect_within("fast tanh, ulp of the float64 result", tanh_err.max_ulp(), 3.0);
  EXPECT_EQ(FastMath::exp(-INFINITY), 0.0f);
  EXPECT_EQ(FastMath::exp(-100.0f), 0.0f);
  EXPECT_EQ(FastMath::exp(INFINITY), INFINITY);
  EXPECT_TRUE(std::isnan(FastMath::exp(NAN)));
  EXPECT_TRUE(std::isnan(FastMath::tanh(NAN)));
  EXPECT_EQ(FastMath::tanh(0.0f), 0.0f);
  EXPECT_EQ(FastMath::tanh(1e-30f), 1e-30f);
  EXPECT_EQ(FastMath::tanh(50.0f), 1.0f);
  EXPECT_EQ(FastMath::tanh(-INFINITY), -1.0f);
}

// The classifier's capped logit cap tanh(x / cap) from one exponential: its error is absolute
// (a few roundings of 1, times cap), also near 0, and it reaches +-cap at the ends and keeps NaN.
TEST(CpuClassifier, CappedLogitAbsoluteErrorAndEnds) {
  using core::cpu::capped_logit;
  for (float cap : {15.0f, 30.0f}) {
    double worst = 0;
    for (int i = 0; i <= 400000; ++i) {
      const float x = -12.0f * cap + 24.0f * cap * static_cast<float>(i) / 400000.0f;
      const double want = cap * std::tanh(static_cast<double>(x) / cap);
      worst = std::max(worst, std::fabs(capped_logit(x, cap, 1.0f / cap) - want));
    }
    // measured 3.8 at both caps (FastMath::exp's ulp and the division's half ulp)
    expect_within("capped logit, absolute error / cap in units of 2^-24",
                  worst / (cap * std::ldexp(1.0, -24)), 6.0);
    EXPECT_EQ(capped_logit(INFINITY, cap, 1.0f / cap), cap);
    EXPECT_EQ(capped_logit(-INFINITY, cap, 1.0f / cap), -cap);
    EXPECT_EQ(capped_logit(1e30f, cap, 1.0f / cap), cap);
    EXPECT_EQ(capped_logit(0.0f, cap, 1.0f / cap), 0.0f);
    EXPECT_TRUE(std::isnan(capped_logit(NAN, cap, 1.0f / cap)));
  }
}

// A NaN logit reaches the loss instead of vanishing in the max.
TEST(CpuBackend, CrossEntropyPropagatesNan) {
  std::vector<float> logits = {0.1f, NAN, 0.3f, 0.0f}, loss(1);
  std::vector<int32_t> tgt = {0};
  core::cpu_backend().cross_entropy(loss.data(), nullptr, logits.data(), tgt.data(), 1, 3, 4, 0.0f,
                                    1.0f);
  EXPECT_TRUE(std::isnan(loss[0]));
}

// The gradient norm of many tensors: one list, the bits of the loop over sum_squares.
TEST(CpuBackend, SumSquaresManyIsTheLoopOverSumSquares) {
  // Sizes around the reduction's 16384-element blocks, an empty tensor among them.
  const std::vector<FVec> xs = {random_vec<float>(16384, 1), random_vec<float>(0, 2),
                                random_vec<float>(40001, 3, 1e-3), random_vec<float>(7, 4, 1e3)};
  std::vector<std::span<const float>> spans;
  double want = 0;
  for (const FVec& x : xs) {
    spans.emplace_back(x);
    want += core::cpu_backend().sum_squares(x.data(), static_cast<int64_t>(x.size()));
  }
  const double got = core::cpu_backend().sum_squares_many(spans);
  EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0) << got << " vs " << want;
  EXPECT_EQ(core::cpu_backend().sum_squares_many({}), 0.0);
  double direct = 0;
  for (const FVec& x : xs)
    for (float v : x)
      direct += static_cast<double>(v) * v;
  EXPECT_NEAR(got, direct, 1e-12 * direct);
  double into = -1;  // the form that leaves the sum in the backend's memory
  core::cpu_backend().sum_squares_many(spans, &into);
  EXPECT_EQ(std::memcmp(&into, &got, sizeof got), 0);
  core::cpu_backend().sum_squares_many({}, &into);
  EXPECT_EQ(into, 0.0);
}

// The step's gradient factor as the trainer computed it when it read the norm back: the clip
// rounded to float, then mean x clip rounded to float; 1 x mean where the norm is within the
// bound, or there is no bound, or the norm is not a number.
float host_grad_factor(double sum_squares, double mean, double max_norm) {
  const double norm = std::sqrt(sum_squares) * mean;
  float clip = 1.0f;
  if (max_norm > 0 && norm > max_norm) clip = static_cast<float>(max_norm / (norm + 1e-6));
  return static_cast<float>(mean * clip);
}

TEST(CpuBackend, GradClipScaleIsTheHostFactorBitForBit) {
  for (double sum_squares : {0.0, 1e-20, 0.3, 1.0, 2.7, 1e6, 1e300, double(INFINITY), double(NAN)})
    for (double mean : {1.0, 0.25, 1.0 / 3, 1.0 / 48, 24.0})
      for (double max_norm : {0.0, -1.0, 0.05, 1.0, 1e9}) {
        const float want = host_grad_factor(sum_squares, mean, max_norm);
        float got = -7.0f;
        core::cpu_backend().grad_clip_scale(&got, &sum_squares, mean, max_norm);
        EXPECT_EQ(std::memcmp(&got, &want, sizeof got), 0)
            << sum_squares << " " << mean << " " << max_norm << ": " << got << " vs " << want;
        EXPECT_EQ(
            core::kmath::float_bits(core::kmath::grad_clip_scale(sum_squares, mean, max_norm)),
            core::kmath::float_bits(want));
      }
  // The bound applies to the mean gradient's norm: sqrt(400) / 4 = 5 > 2 clips to 2 / 5.
  EXPECT_FLOAT_EQ(core::kmath::grad_clip_scale(400.0, 0.25, 2.0), 0.25f * (2.0f / 5.0f));
  EXPECT_EQ(core::kmath::grad_clip_scale(400.0, 0.25, 6.0), 0.25f);
}

// The modern blocks' fused split, QK-norm and rotary, forward and backward, against the ops it
// replaced in the model's order (the backward's adding into zeroed buffers included), bit for
// bit: head dims 8 and 64, the truncated rotary, several heads and batch rows, f32 and bf16 d qkv
// (filled with NaNs first: every element is written).
TEST(CpuBackend, QkNormRotaryIsTheUnfusedOpsBitForBit) {
  core::Backend& be = core::cpu_backend();
  struct Case {
    int64_t B, T, H, hd;
    bool truncated;
  };
  for (const Case c : {Case{2, 5, 3, 8, false}, Case{1, 7, 2, 64, true}, Case{2, 3, 1, 16, true}}) {
    SCOPED_TRACE("hd " + std::to_string(c.hd) + (c.truncated ? " truncated" : ""));
    const int64_t N = c.B * c.T, D = c.H * c.hd, n = N * D, rows = N * c.H;
    const float eps = 1e-6f, base = c.truncated ? 1024.0f : 10000.0f;
    const FVec qkv = random_vec<float>(N * 3 * D, 11, 3.0);
    FVec q(n), k(n), v(n), qr(n), kr(n), qs(rows), ks(rows);
    be.split_heads(q.data(), k.data(), v.data(), qkv.data(), c.B, c.T, c.H, c.hd);
    be.rmsnorm_forward(qr.data(), qs.data(), q.data(), rows, c.hd, eps);
    be.rmsnorm_forward(kr.data(), ks.data(), k.data(), rows, c.hd, eps);
    be.rotary_forward(qr.data(), qr.data(), c.B * c.H, c.T, c.hd, base, c.truncated);
    be.rotary_forward(kr.data(), kr.data(), c.B * c.H, c.T, c.hd, base, c.truncated);
    FVec fq(n), fk(n), fv(n), fqr(n), fkr(n), fqs(rows), fks(rows);
    be.qk_norm_rotary_forward(fqr.data(), fkr.data(), fq.data(), fk.data(), fv.data(), fqs.data(),
                              fks.data(), qkv.data(), c.B, c.T, c.H, c.hd, eps, base, c.truncated);
    EXPECT_EQ(fq, q);
    EXPECT_EQ(fk, k);
    EXPECT_EQ(fv, v);
    EXPECT_EQ(fqr, qr);
    EXPECT_EQ(fkr, kr);
    EXPECT_EQ(fqs, qs);
    EXPECT_EQ(fks, ks);

    const FVec dqr = random_vec<float>(n, 12), dkr = random_vec<float>(n, 13),
               dv = random_vec<float>(n, 14);
    FVec dq2(n, 0.0f), dk2(n, 0.0f), dq(n, 0.0f), dk(n, 0.0f), dqkv(N * 3 * D, 0.0f);
    be.rotary_backward(dq2.data(), dqr.data(), c.B * c.H, c.T, c.hd, base, c.truncated);
    be.rotary_backward(dk2.data(), dkr.data(), c.B * c.H, c.T, c.hd, base, c.truncated);
    be.rmsnorm_backward(dq.data(), dq2.data(), q.data(), qs.data(), rows, c.hd);
    be.rmsnorm_backward(dk.data(), dk2.data(), k.data(), ks.data(), rows, c.hd);
    be.split_heads_backward(dqkv.data(), dq.data(), dk.data(), dv.data(), c.B, c.T, c.H, c.hd);
    FVec fused(N * 3 * D, std::nanf(""));
    be.qk_norm_rotary_backward(fused.data(), dqr.data(), dkr.data(), dv.data(), q.data(), k.data(),
                               qs.data(), ks.data(), c.B, c.T, c.H, c.hd, base, c.truncated);
    EXPECT_EQ(std::memcmp(fused.data(), dqkv.data(), fused.size() * sizeof(float)), 0);
    std::vector<core::bf16> dqkv_b(N * 3 * D), fused_b(N * 3 * D, core::bf16{0x7FC1});
    be.split_heads_backward(dqkv_b.data(), dq.data(), dk.data(), dv.data(), c.B, c.T, c.H, c.hd);
    be.qk_norm_rotary_backward(fused_b.data(), dqr.data(), dkr.data(), dv.data(), q.data(),
                               k.data(), qs.data(), ks.data(), c.B, c.T, c.H, c.hd, base,
                               c.truncated);
    EXPECT_EQ(std::memcmp(fused_b.data(), dqkv_b.data(), fused_b.size() * sizeof(core::bf16)), 0);
  }
  FVec x(3 * 6);
  EXPECT_THROW(be.qk_norm_rotary_forward(x.data(), x.data(), x.data(), x.data(), x.data(), x.data(),
                                         x.data(), x.data(), 1, 1, 1, 6, 1e-6f, 1024.0f, true),
               core::Error);  // the truncated rotary needs a multiple of 4
}

// Record #89's paired positions: head h of token t turned at 2t + h mod 2 is, bit for bit, the
// plain op's head h at that position of a sequence of 2T (the frequencies from a table equal to
// the op's own: the same values).
TEST(CpuBackend, QkNormRotaryPairedTurnsHeadsAtTwiceTheirPosition) {
  core::Backend& be = core::cpu_backend();
  const int64_t B = 2, T = 5, H = 4, hd = 16, D = H * hd, n = B * T * D;
  const float eps = 1e-6f, base = 1024.0f;
  FVec freq(hd / 2);
  for (int64_t j = 0; j < hd / 2; ++j)
    freq[j] = core::kmath::rotary_inv_freq(j, hd / 2, base, true);
  const FVec qkv = random_vec<float>(B * T * 3 * D, 12, 3.0);
  FVec qkv2 = random_vec<float>(B * 2 * T * 3 * D, 13, 3.0);  // token t, head h at 2t + h mod 2
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t s = 0; s < 3; ++s)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t d = 0; d < hd; ++d)
            qkv2[((b * 2 * T + 2 * t + h % 2) * 3 + s) * D + h * hd + d] =
                qkv[((b * T + t) * 3 + s) * D + h * hd + d];
  FVec q(n), k(n), v(n), qr(n), kr(n), qs(B * T * H), ks(B * T * H);
  be.qk_norm_rotary_forward(qr.data(), kr.data(), q.data(), k.data(), v.data(), qs.data(),
                            ks.data(), qkv.data(), B, T, H, hd, eps, base, true,
                            {freq.data(), true});
  FVec q2(2 * n), k2(2 * n), v2(2 * n), qr2(2 * n), kr2(2 * n), qs2(2 * B * T * H),
      ks2(2 * B * T * H);
  be.qk_norm_rotary_forward(qr2.data(), kr2.data(), q2.data(), k2.data(), v2.data(), qs2.data(),
                            ks2.data(), qkv2.data(), B, 2 * T, H, hd, eps, base, true);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < hd; ++d) {
          const int64_t at = ((b * H + h) * T + t) * hd + d,
                        at2 = ((b * H + h) * 2 * T + 2 * t + h % 2) * hd + d;
          ASSERT_EQ(qr[at], qr2[at2]) << "q head " << h << " token " << t;
          ASSERT_EQ(kr[at], kr2[at2]) << "k head " << h << " token " << t;
        }
}

// Record #89's attention output corrections in bf16 precision: the bf16 forward is the f32 one on
// the widened values, each output rounded once; the backward from a bf16 y is the f32 one's
// (within float rounding).
TEST(CpuBackend, AttentionOutBf16IsTheF32OnWidenedValues) {
  core::Backend& be = core::cpu_backend();
  const int64_t B = 2, T = 3, H = 2, hd = 8, n = B * T * H * hd;
  const FVec y0 = random_vec<float>(n, 21, 1.0), v = random_vec<float>(n, 22, 1.0),
             dout = random_vec<float>(n, 23, 1.0), alpha = random_vec<float>(H, 24, 1.0),
             gate = random_vec<float>(B * T * H, 25, 1.0);
  std::vector<core::bf16> yb(n), outb(n);
  FVec y(n);
  for (int64_t i = 0; i < n; ++i) {
    yb[i] = core::kmath::bf16_from_float(y0[i]);
    y[i] = core::kmath::float_from_bf16(yb[i]);
  }
  FVec da(H, 0.0f), dg(B * T * H, 0.0f), dab(H, 0.0f), dgb(B * T * H, 0.0f);
  FVec out(n), dy(n), dv(n, 0.0f), dyb(n), dvb(n, 0.0f);
  be.attention_out_forward(out.data(), y.data(), v.data(), B, T, H, hd,
                           {alpha.data(), da.data(), 0}, {gate.data(), dg.data(), H});
  be.attention_out_forward(outb.data(), yb.data(), v.data(), B, T, H, hd,
                           {alpha.data(), dab.data(), 0}, {gate.data(), dgb.data(), H});
  for (int64_t i = 0; i < n; ++i)
    ASSERT_EQ(outb[i].bits, core::kmath::bf16_from_float(out[i]).bits) << i;
  be.attention_out_backward(dy.data(), dv.data(), dout.data(), y.data(), v.data(), B, T, H, hd,
                            {alpha.data(), da.data(), 0}, {gate.data(), dg.data(), H});
  be.attention_out_backward(dyb.data(), dvb.data(), dout.data(), yb.data(), v.data(), B, T, H, hd,
                            {alpha.data(), dab.data(), 0}, {gate.data(), dgb.data(), H});
  // The same arithmetic; the two instantiations may contract it differently (measured: last bits).
  for (const auto& [got, want] :
       {std::pair{&dyb, &dy}, std::pair{&dvb, &dv}, std::pair{&dab, &da}, std::pair{&dgb, &dg}})
    for (size_t i = 0; i < want->size(); ++i)
      ASSERT_NEAR((*got)[i], (*want)[i], 1e-6 * (1.0 + std::abs((*want)[i]))) << i;
}

// scale_many_by reads its factor from the backend's memory: scale_many's bits.
TEST(CpuBackend, ScaleManyByIsScaleMany) {
  FVec a = random_vec<float>(1000, 5), b = random_vec<float>(17, 6), a2 = a, b2 = b;
  const float factor = -0.3f;
  const std::vector<std::span<float>> by = {a, {}, b}, plain = {a2, {}, b2};
  core::cpu_backend().scale_many_by(by, &factor);
  core::cpu_backend().scale_many(plain, factor);
  EXPECT_EQ(a, a2);
  EXPECT_EQ(b, b2);
}

}  // namespace
