// The CUDA backend against the CPU backend (the reference): same random inputs copied to both,
// results compared. Linear algebra is checked by its defining identities instead, since factors
// are unique only up to signs. Without a device every device test skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/check.h"
#include "core/kernel_math.h"
#include "core/rng.h"
#include "tests/backend_test_data.h"
#include "tests/core/gemm_bar.h"
#include "tests/cuda_vs_cpu.h"

#ifdef ENGINE_HAVE_CUDA
#include "core/cuda/attention_path.h"
#include "core/cuda/classifier_path.h"
#include "core/cuda/cuda_allocator.h"
#include "core/cuda/cuda_backend.h"
#endif

namespace core {
namespace {

using test::CudaVsCpu;
using test::DeviceScratch;
using test::ShiftedScratch;
using test_data::random_vector;

std::vector<int32_t> random_ids(size_t n, int32_t limit, uint64_t seed) {
  std::vector<int32_t> v(n);
  Rng rng(seed);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<int32_t>(rng.next_below(limit));
  return v;
}

// ---- without a device ---------------------------------------------------------------------------

TEST(CudaAvailability, NoDeviceMeansAClearError) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  try {
    make_cuda_backend(0);
    FAIL() << "make_cuda_backend(0) succeeded although cuda_available() is false";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("cuda:0"), std::string::npos) << what;
    EXPECT_TRUE(what.find("device") != std::string::npos || what.find("CUDA") != std::string::npos)
        << what;
  }
}

TEST(CudaAvailability, AgreesWithBackendCreation) {
  if (cuda_available()) {
    EXPECT_NO_THROW(make_cuda_backend(0));
  } else {
    EXPECT_THROW(make_cuda_backend(0), Error);
  }
}

TEST(CudaAvailability, RejectsAnIndexOutOfRange) {
  EXPECT_THROW(make_cuda_backend(1 << 20), Error);
  EXPECT_THROW(make_cuda_backend(-1), Error);
}

// ---- with a device ------------------------------------------------------------------------------

TEST_F(CudaVsCpu, NameAndDevice) {
  EXPECT_TRUE(gpu().device().is_cuda());
  EXPECT_EQ(std::string(gpu().name()).rfind("cuda:0", 0), 0u) << gpu().name();
  EXPECT_TRUE(gpu().allocator().device().is_cuda());
}

TEST_F(CudaVsCpu, AllocatorCountsAndReusesBlocks) {
  Allocator& alloc = gpu().allocator();
  size_t live0 = alloc.live_bytes();
  void* a = alloc.allocate(1000);
  EXPECT_EQ(alloc.live_bytes(), live0 + 1000);
  EXPECT_GE(alloc.peak_bytes(), live0 + 1000);
  alloc.deallocate(a, 1000);
  EXPECT_EQ(alloc.live_bytes(), live0);
  void* b = alloc.allocate(900);  // same 1024-byte bucket: the cached block comes back
  EXPECT_EQ(a, b);
  alloc.deallocate(b, 900);
#ifdef ENGINE_HAVE_CUDA
  auto& cuda_alloc = static_cast<CudaBackend&>(gpu()).cuda_allocator();
  EXPECT_GE(cuda_alloc.cached_bytes(), 1024u);
  EXPECT_GE(cuda_alloc.reserved_bytes(), cuda_alloc.cached_bytes());
  cuda_alloc.release_cached();
  EXPECT_EQ(cuda_alloc.cached_bytes(), 0u);
#endif
  EXPECT_EQ(alloc.allocate(0), nullptr);
}

#ifdef ENGINE_HAVE_CUDA
// A repeated pattern of ops with scratch (attention's backward, a copy through a scratch buffer)
// reaches the driver on its first round only: later rounds run on cached blocks.
TEST_F(CudaVsCpu, AllocatorStopsReachingTheDriverAfterTheFirstRound) {
  auto& cuda_alloc = static_cast<CudaBackend&>(gpu()).cuda_allocator();
  const int64_t BH = 2, T = 70, hd = 64, n = BH * T * hd;
  auto x = random_vector(n, 1);
  std::vector<int64_t> driver_allocs;
  for (int round = 0; round < 3; ++round) {
    DeviceScratch scratch(gpu());
    float *q = scratch.upload(x), *out = scratch.alloc<float>(n),
          *lse = scratch.alloc<float>(BH * T), *grads = scratch.alloc<float>(3 * n);
    gpu().attention_forward(out, lse, q, q, q, BH, T, hd, 0.125f);
    gpu().attention_backward(grads, grads + n, grads + 2 * n, q, out, lse, q, q, q, BH, T, hd,
                             0.125f);
    gpu().copy(q + 1, q, (n - 1) * sizeof(float));  // overlapping: through a scratch buffer
    gpu().synchronize();
    driver_allocs.push_back(cuda_alloc.driver_allocs());
  }
  EXPECT_EQ(driver_allocs[1], driver_allocs[0]);
  EXPECT_EQ(driver_allocs[2], driver_allocs[0]);
}
#endif

// Marks are events on the backend's stream: the time between two covers the work issued
// between them; a CPU mark is refused.
TEST_F(CudaVsCpu, TimeMarksMeasureTheWorkBetweenThem) {
  const int64_t n = 2048;
  float* a = dev().alloc<float>(n * n);
  float* c = dev().alloc<float>(n * n);
  gpu().fill_zero(a, n * n * sizeof(float));
  const TimeMark before = gpu().mark();
  GemmArgs g;
  g.m = n, g.n = n, g.k = n;
  for (int r = 0; r < 4; ++r)
    gpu().gemm(g, a, a, c);
  const TimeMark after = gpu().mark();
  EXPECT_GT(gpu().elapsed_ms(before, after), 0.0);
  EXPECT_EQ(gpu().elapsed_ms(after, after), 0.0);
  EXPECT_THROW(gpu().elapsed_ms(cpu().mark(), after), Error);
}

TEST_F(CudaVsCpu, CopiesAndFill) {
  auto host = random_vector(1000, 1);
  float* a = dev().upload(host);
  float* b = dev().alloc<float>(1000);
  gpu().copy(b, a, 1000 * sizeof(float));
  EXPECT_EQ(dev().download(b, 1000), host);
  gpu().fill_zero(b + 10, 20 * sizeof(float));
  auto back = dev().download(b, 1000);
  for (int i = 0; i < 1000; ++i)
    EXPECT_EQ(back[i], (i >= 10 && i < 30) ? 0.0f : host[i]);
}

// ---- GEMM ---------------------------------------------------------------------------------------

void check_gemm(Backend& cpu, Backend& gpu, DeviceScratch& dev, GemmArgs g, uint64_t seed) {
  int64_t lda = g.lda ? g.lda : (g.trans_a ? g.m : g.k);
  int64_t ldb = g.ldb ? g.ldb : (g.trans_b ? g.k : g.n);
  int64_t ldc = g.ldc ? g.ldc : g.n;
  int64_t rows_a = g.trans_a ? g.k : g.m, rows_b = g.trans_b ? g.n : g.k;
  int64_t batch = g.batch;
  if (batch > 1 && g.stride_a == 0) g.stride_a = rows_a * lda;
  if (batch > 1 && g.stride_b == 0) g.stride_b = rows_b * ldb;
  if (batch > 1 && g.stride_c == 0) g.stride_c = g.m * ldc;
  auto a = random_vector(g.stride_a * (batch - 1) + rows_a * lda, seed);
  auto b = random_vector(g.stride_b * (batch - 1) + rows_b * ldb, seed + 1);
  auto c = random_vector(g.stride_c * (batch - 1) + g.m * ldc, seed + 2);
  auto c_cpu = c;
  cpu.gemm(g, a.data(), b.data(), c_cpu.data());
  float* dc = dev.upload(c);
  gpu.gemm(g, dev.upload(a), dev.upload(b), dc);
  EXPECT_CLOSE(dev.download(dc, c.size()), c_cpu, 1e-4)
      << "trans_a=" << g.trans_a << " trans_b=" << g.trans_b << " m=" << g.m << " n=" << g.n
      << " k=" << g.k << " batch=" << g.batch;
}

TEST_F(CudaVsCpu, GemmAllTransposesOddSizes) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      check_gemm(cpu(), gpu(), dev(), {.trans_a = ta, .trans_b = tb, .m = 7, .n = 13, .k = 5}, 10);
      check_gemm(
          cpu(), gpu(), dev(),
          {.trans_a = ta, .trans_b = tb, .m = 33, .n = 17, .k = 64, .alpha = 0.5f, .beta = 1.0f},
          20);
    }
  }
}

TEST_F(CudaVsCpu, GemmLeadingDimensionsAndBatches) {
  check_gemm(cpu(), gpu(), dev(), {.m = 6, .n = 5, .k = 4, .lda = 9, .ldb = 7, .ldc = 8}, 30);
  check_gemm(cpu(), gpu(), dev(),
             {.trans_b = true, .m = 12, .n = 12, .k = 8, .alpha = 0.25f, .batch = 5}, 40);
  check_gemm(cpu(), gpu(), dev(),
             {.trans_a = true, .m = 9, .n = 3, .k = 11, .beta = 1.0f, .batch = 3}, 50);
  // A shared right operand (stride 0), as in a per-expert loop over one input.
  check_gemm(cpu(), gpu(), dev(),
             {.m = 4, .n = 6, .k = 5, .batch = 3, .stride_a = 20, .stride_b = 0, .stride_c = 24},
             60);
}

TEST_F(CudaVsCpu, GemmWithEmptyInnerDimensionScalesC) {
  // k = 0: C = beta C on both backends (cuBLAS refuses lda = 0; the shared resolver makes it 1).
  check_gemm(cpu(), gpu(), dev(), {.m = 5, .n = 7, .k = 0, .beta = 0.5f}, 70);
  check_gemm(cpu(), gpu(), dev(), {.m = 3, .n = 4, .k = 0, .ldc = 6, .batch = 2}, 80);
  // beta 0 clears C even where it held NaN.
  std::vector<float> nan_c(12, std::nanf(""));
  float* dc = dev().upload(nan_c);
  gpu().gemm({.m = 3, .n = 4, .k = 0}, dev().alloc<float>(1), dev().alloc<float>(1), dc);
  EXPECT_EQ(dev().download(dc, 12), std::vector<float>(12, 0.0f));
}

TEST_F(CudaVsCpu, GemmRefusesABatchWritingOneOutput) {
  float* x = dev().alloc<float>(64);
  const GemmArgs racing{.m = 2, .n = 2, .k = 2, .batch = 3, .stride_a = 4, .stride_b = 4};
  EXPECT_THROW(gpu().gemm(racing, x, x, x + 32), Error);
  std::vector<float> h(64);
  EXPECT_THROW(cpu().gemm(racing, h.data(), h.data(), h.data() + 32), Error);
}

// ---- bf16 and TF32 GEMMs (docs/precision.md) -----------------------------------------------

// Both backends multiply the same bf16 values exactly (8 + 8 significant bits fit in f32) and
// add the products in f32 in their own orders: within gamma_(k+2) each of the exact result
// (tests/core/gemm_bar.h), u = 2^-24 on the CPU and 2^-23 on tensor cores, whose additions may
// truncate rather than round (Fasi, Higham, Mikaitis, Pranesh 2021).
double accumulation_bar(const GemmArgs& g) {
  return test::gamma_bound(g.k + 2, 0x1p-24) + test::gamma_bound(g.k + 2, 0x1p-23);
}

std::vector<GemmArgs> low_precision_gemm_cases() {
  std::vector<GemmArgs> cases;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      cases.push_back({.trans_a = ta, .trans_b = tb, .m = 33, .n = 17, .k = 64});
  cases.push_back({.trans_b = true, .m = 256, .n = 192, .k = 128});                // y = x W^T
  cases.push_back({.trans_a = true, .m = 192, .n = 128, .k = 256, .beta = 1.0f});  // dW += dy^T x
  cases.push_back({.m = 6, .n = 5, .k = 4, .alpha = 0.5f, .lda = 9, .ldb = 7, .ldc = 8});
  cases.push_back({.trans_b = true,
                   .m = 12,
                   .n = 12,
                   .k = 8,
                   .batch = 5,
                   .stride_a = 96,
                   .stride_b = 96,
                   .stride_c = 144});
  return cases;
}

TEST_F(CudaVsCpu, Bf16ConversionsAreBitIdentical) {
  // 4099 converts one float at a time, 4096 16-byte packs.
  for (const int64_t n : {int64_t{4099}, int64_t{4096}}) {
    std::vector<float> x(n);
    core::Rng rng(3);
    for (auto& v : x) {
      const uint32_t bits = static_cast<uint32_t>(rng.next_u64());
      std::memcpy(&v, &bits, sizeof(v));  // every kind of float: NaN, infinity, subnormals
    }
    std::vector<bf16> want(n);
    cpu().f32_to_bf16(want.data(), x.data(), n);
    bf16* d = dev().alloc<bf16>(n);
    gpu().f32_to_bf16(d, dev().upload(x), n);
    const std::vector<bf16> got = dev().download(d, n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(got[i].bits, want[i].bits) << i;
    std::vector<float> back_cpu(n);
    cpu().bf16_to_f32(back_cpu.data(), want.data(), n);
    float* back = dev().alloc<float>(n);
    gpu().bf16_to_f32(back, d, n);
    const std::vector<float> back_gpu = dev().download(back, n);
    EXPECT_EQ(std::memcmp(back_gpu.data(), back_cpu.data(), n * sizeof(float)), 0);
  }
}

// The cross-entropy on bf16 logits (bf16 precision's head): the devices compute the f32
// gradient in different orders (1e-6 relative apart, as in CrossEntropyWithPaddingAndSoftcap) and
// round it once, so an element may land on the other bf16 neighbour: within one bf16 unit, 2^-7
// relative (plus 2^-133 absolute); the losses within 1e-5. Rows that fit shared memory (GPT-2's
// 50304 columns, odd widths whose rows start unaligned, V = Vp as with model.loss_over_padding)
// and a row too wide for it (the two-pass kernel); the gradient in place, apart, or none.
TEST_F(CudaVsCpu, CrossEntropyOnBf16LogitsWithinOneBf16Unit) {
  struct Case {
    int64_t N, V, Vp;
    float cap;
  };
  for (const Case& k : {Case{19, 300, 320, 15.0f}, Case{5, 999, 1001, 0.0f}, Case{4, 7, 7, 15.0f},
                        Case{3, 50257, 50304, 15.0f}, Case{2, 150000, 150016, 0.0f}}) {
    const int64_t n = k.N * k.Vp;
    std::vector<bf16> logits(n);
    for (int64_t i = 0; i < n; ++i)
      logits[i] = kmath::bf16_from_float(static_cast<float>(3.0 * core::rng_normal(5, i)));
    std::vector<int32_t> targets = random_ids(k.N, static_cast<int32_t>(k.V), 4);
    std::vector<float> loss(k.N);
    std::vector<bf16> want(n);
    cpu().cross_entropy(loss.data(), want.data(), logits.data(), targets.data(), k.N, k.V, k.Vp,
                        k.cap, 1.0f / k.N);
    float* gl = dev().alloc<float>(k.N);
    bf16* gz = dev().upload(logits);
    bf16* gd = dev().alloc<bf16>(n);
    int32_t* gt = dev().upload(targets);
    const std::string what = "V " + std::to_string(k.V) + " Vp " + std::to_string(k.Vp);
    auto expect_gradient = [&](const bf16* d) {
      const std::vector<bf16> got = dev().download(d, n);
      for (int64_t i = 0; i < n; ++i) {
        const float g = kmath::float_from_bf16(got[i]), w = kmath::float_from_bf16(want[i]);
        ASSERT_LE(std::fabs(g - w), 0x1p-7f * std::fabs(w) + 0x1p-133f) << what << " at " << i;
      }
    };
    gpu().cross_entropy(gl, gd, gz, gt, k.N, k.V, k.Vp, k.cap, 1.0f / k.N);
    expect_gradient(gd);
    EXPECT_CLOSE(dev().download(gl, k.N), loss, 1e-5);
    gpu().fill_zero(gl, k.N * sizeof(float));
    gpu().cross_entropy(gl, static_cast<bf16*>(nullptr), gz, gt, k.N, k.V, k.Vp, k.cap, 1.0f / k.N);
    EXPECT_CLOSE(dev().download(gl, k.N), loss, 1e-5);
    gpu().cross_entropy(gl, gz, gz, gt, k.N, k.V, k.Vp, k.cap, 1.0f / k.N);  // in place
    expect_gradient(gz);
    EXPECT_CLOSE(dev().download(gl, k.N), loss, 1e-5);
  }
}

// The GEMM with a bf16 C: with exact sums (integer operands, tests/core/bf16_head_test.cpp) both
// devices' f32 results are the exact value, so their bf16 C must agree bit for bit (cuBLAS rounds
// to nearest even as kmath does); with random values each within the accumulation bars of both
// devices plus one bf16 unit, 2^-7 of the value.
TEST_F(CudaVsCpu, GemmWithBf16OutputMatchesTheCpu) {
  for (bool integers : {true, false}) {
    uint64_t seed = 40;
    for (GemmArgs args : low_precision_gemm_cases()) {
      args.beta = 0.0f;
      const GemmArgs g = resolve_gemm_args(args);
      const int64_t na = (g.batch - 1) * g.stride_a + (g.trans_a ? g.k : g.m) * g.lda;
      const int64_t nb = (g.batch - 1) * g.stride_b + (g.trans_b ? g.n : g.k) * g.ldb;
      const int64_t nc = (g.batch - 1) * g.stride_c + g.m * g.ldc;
      core::Rng rng(seed += 10);
      auto draw = [&](int64_t i, float step) {
        if (integers) return kmath::bf16_from_float(step * (float(rng.next_below(31)) - 15.0f));
        return kmath::bf16_from_float(static_cast<float>(core::rng_normal(seed, i)));
      };
      std::vector<bf16> a(na), b(nb);
      for (int64_t i = 0; i < na; ++i)
        a[i] = draw(i, 0.25f);
      for (int64_t i = 0; i < nb; ++i)
        b[i] = draw(i + na, 1.0f);
      std::vector<bf16> want(nc, bf16{0});
      cpu().gemm(g, a.data(), b.data(), want.data());
      bf16* gc = dev().upload(std::vector<bf16>(nc, bf16{0}));
      gpu().gemm(g, dev().upload(a), dev().upload(b), gc);
      const std::vector<bf16> got = dev().download(gc, nc);
      for (int64_t p = 0; p < g.batch; ++p) {
        for (int64_t i = 0; i < g.m; ++i) {
          for (int64_t j = 0; j < g.n; ++j) {
            const int64_t at = p * g.stride_c + i * g.ldc + j;
            if (integers) {
              ASSERT_EQ(got[at].bits, want[at].bits) << "m " << g.m << " n " << g.n << " at " << at;
              continue;
            }
            double mass = 0;
            for (int64_t l = 0; l < g.k; ++l) {
              const bf16 av = a[p * g.stride_a + (g.trans_a ? l * g.lda + i : i * g.lda + l)];
              const bf16 bv = b[p * g.stride_b + (g.trans_b ? j * g.ldb + l : l * g.ldb + j)];
              mass += std::fabs(double(kmath::float_from_bf16(av)) * kmath::float_from_bf16(bv));
            }
            const double w = kmath::float_from_bf16(want[at]);
            const double bar = accumulation_bar(g) * std::fabs(g.alpha) * mass;
            ASSERT_LE(std::fabs(kmath::float_from_bf16(got[at]) - w),
                      bar + 0x1p-7 * (std::fabs(w) + bar) + 1e-300)
                << "m " << g.m << " n " << g.n << " at " << at;
          }
        }
      }
    }
  }
}

// The ops that store bf16 activations (bf16 precision): where the devices compute the same f32
// value (copies, the activations' element math) the bf16 results are bit-identical or within one
// bf16 unit (the GPU's tanh and exp differ from the CPU's by float ulps, as in Elementwise); the
// norms' f32 values differ in the order of the row sums (1e-6 relative), so an element may land
// on the other bf16 neighbour: within one bf16 unit, 2^-7 relative. The bias gradient from bf16
// and the bf16 row gather are the f32 ops of the widened values.
TEST_F(CudaVsCpu, Bf16StoringOpsMatchTheCpu) {
  auto within_one_unit = [](const std::vector<bf16>& got, const std::vector<bf16>& want,
                            const char* what) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const float g = kmath::float_from_bf16(got[i]), w = kmath::float_from_bf16(want[i]);
      ASSERT_LE(std::fabs(g - w), 0x1p-7f * std::fabs(w) + 0x1p-133f) << what << " " << i;
    }
  };
  const int64_t N = 37, C = 200;
  const auto x = random_vector(N * C, 11), w = random_vector(C, 12), b = random_vector(C, 13);
  std::vector<bf16> want(N * C);
  std::vector<float> mean(N), rstd(N);
  bf16* out = dev().alloc<bf16>(N * C);
  float* gm = dev().alloc<float>(N);
  float* gr = dev().alloc<float>(N);
  cpu().layernorm_forward(want.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                          1e-5f);
  gpu().layernorm_forward(out, gm, gr, dev().upload(x), dev().upload(w), dev().upload(b), N, C,
                          1e-5f);
  within_one_unit(dev().download(out, N * C), want, "layernorm");
  EXPECT_CLOSE(dev().download(gm, N), mean, 1e-5);
  EXPECT_CLOSE(dev().download(gr, N), rstd, 1e-5);
  cpu().rmsnorm_forward(want.data(), rstd.data(), x.data(), N, C, 1e-6f);
  gpu().rmsnorm_forward(out, gr, dev().upload(x), N, C, 1e-6f);
  within_one_unit(dev().download(out, N * C), want, "rmsnorm");
  EXPECT_CLOSE(dev().download(gr, N), rstd, 1e-5);

  const int64_t n = N * C;
  const auto dout = random_vector(n, 14);
  float* gx = dev().upload(x);
  float* gd = dev().upload(dout);
  for (const bool gelu : {true, false}) {
    std::vector<bf16> want_act(n), want_grad(n);
    bf16* act = dev().alloc<bf16>(n);
    bf16* grad = dev().alloc<bf16>(n);
    if (gelu) {
      cpu().gelu_forward(want_act.data(), x.data(), n);
      cpu().gelu_backward(want_grad.data(), x.data(), dout.data(), n);
      gpu().gelu_forward(act, gx, n);
      gpu().gelu_backward(grad, gx, gd, n);
    } else {
      cpu().relu2_forward(want_act.data(), x.data(), n);
      cpu().relu2_backward(want_grad.data(), x.data(), dout.data(), n);
      gpu().relu2_forward(act, gx, n);
      gpu().relu2_backward(grad, gx, gd, n);
    }
    within_one_unit(dev().download(act, n), want_act, gelu ? "gelu" : "relu2");
    within_one_unit(dev().download(grad, n), want_grad, gelu ? "gelu grad" : "relu2 grad");
  }

  const int64_t B = 2, T = 5, H = 3, hd = 8, D = H * hd, M = B * T;
  const auto dq = random_vector(M * D, 16), dk = random_vector(M * D, 17),
             dv = random_vector(M * D, 18);
  std::vector<bf16> want_dqkv(M * 3 * D);
  cpu().split_heads_backward(want_dqkv.data(), dq.data(), dk.data(), dv.data(), B, T, H, hd);
  bf16* dqkv = dev().alloc<bf16>(M * 3 * D);
  gpu().split_heads_backward(dqkv, dev().upload(dq), dev().upload(dk), dev().upload(dv), B, T, H,
                             hd);
  const std::vector<bf16> got_dqkv = dev().download(dqkv, M * 3 * D);
  for (int64_t i = 0; i < M * 3 * D; ++i)
    ASSERT_EQ(got_dqkv[i].bits, want_dqkv[i].bits) << "split_heads_backward " << i;

  std::vector<float> dbias(C, 0.5f);
  float* gdb = dev().upload(dbias);
  cpu().bias_backward(dbias.data(), want.data(), N, C);
  gpu().bias_backward(gdb, dev().upload(want), N, C);
  EXPECT_CLOSE(dev().download(gdb, C), dbias, 1e-5);
  const std::vector<int32_t> index = random_ids(2 * N, static_cast<int32_t>(N), 19);
  std::vector<bf16> want_rows(2 * N * C);
  cpu().gather_rows(want_rows.data(), want.data(), index.data(), 2 * N, C);
  bf16* rows = dev().alloc<bf16>(2 * N * C);
  gpu().gather_rows(rows, dev().upload(want), dev().upload(index), 2 * N, C);
  const std::vector<bf16> got_rows = dev().download(rows, 2 * N * C);
  for (int64_t i = 0; i < 2 * N * C; ++i)
    ASSERT_EQ(got_rows[i].bits, want_rows[i].bits) << "gather_rows " << i;
}

// A bf16 result of the residual stream against the CPU's: within one bf16 unit (2^-7 relative),
// or 1e-5 absolute where the f32 terms cancel (the value is then the rounding of the terms, which
// the two backends may contract into FMAs differently: 0.75 a - 1.3 b of two bf16 values is 0 or
// -2.5e-8 depending on which product is rounded).
void within_one_unit(const std::vector<bf16>& got, const std::vector<bf16>& want,
                     const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const float g = kmath::float_from_bf16(got[i]), w = kmath::float_from_bf16(want[i]);
    ASSERT_LE(std::fabs(g - w), 0x1p-7f * std::fabs(w) + 1e-5f) << what << " " << i;
  }
}

std::vector<bf16> bf16_values(const std::vector<float>& v) {
  std::vector<bf16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    out[i] = kmath::bf16_from_float(v[i]);
  return out;
}

// The residual stream's ops in bf16 precision: the norms reading the bf16 stream (their f32
// values differ in the order of the row sums, so the bf16 outputs are within one bf16 unit, the
// statistics and the f32 gradients within 1e-5), the mixes and the embedding writing it (the same
// f32 expression rounded: within one unit), the MoE's combine (the same ascending-row sum from the
// widened base: within one unit).
TEST_F(CudaVsCpu, Bf16StreamOpsMatchTheCpu) {
  const int64_t N = 37, C = 200, n = N * C;
  const auto x = bf16_values(random_vector(n, 21)), y = bf16_values(random_vector(n, 22));
  const auto w = random_vector(C, 23), b = random_vector(C, 24), dy = random_vector(n, 25);
  bf16* gx = dev().upload(x);
  std::vector<bf16> want(n);
  std::vector<float> mean(N), rstd(N);
  bf16* out = dev().alloc<bf16>(n);
  float* gm = dev().alloc<float>(N);
  float* gr = dev().alloc<float>(N);
  cpu().layernorm_forward(want.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                          1e-5f);
  gpu().layernorm_forward(out, gm, gr, gx, dev().upload(w), dev().upload(b), N, C, 1e-5f);
  within_one_unit(dev().download(out, n), want, "layernorm of bf16");
  EXPECT_CLOSE(dev().download(gm, N), mean, 1e-5);
  EXPECT_CLOSE(dev().download(gr, N), rstd, 1e-5);
  std::vector<float> dx(n, 0.5f), dw(C, 0.25f), db(C, -0.25f);
  float* gdx = dev().upload(dx);
  float* gdw = dev().upload(dw);
  float* gdb = dev().upload(db);
  cpu().layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                           mean.data(), rstd.data(), N, C);
  gpu().layernorm_backward(gdx, gdw, gdb, dev().upload(dy), gx, dev().upload(w), dev().upload(mean),
                           dev().upload(rstd), N, C);
  EXPECT_CLOSE(dev().download(gdx, n), dx, 1e-5);
  EXPECT_CLOSE(dev().download(gdw, C), dw, 1e-5);
  EXPECT_CLOSE(dev().download(gdb, C), db, 1e-5);
  cpu().rmsnorm_forward(want.data(), rstd.data(), x.data(), N, C, 1e-6f);
  gpu().rmsnorm_forward(out, gr, gx, N, C, 1e-6f);
  within_one_unit(dev().download(out, n), want, "rmsnorm of bf16");
  EXPECT_CLOSE(dev().download(gr, N), rstd, 1e-5);
  std::vector<float> dr(n, 0.5f);
  float* gdr = dev().upload(dr);
  cpu().rmsnorm_backward(dr.data(), dy.data(), x.data(), rstd.data(), N, C);
  gpu().rmsnorm_backward(gdr, dev().upload(dy), gx, dev().upload(rstd), N, C);
  EXPECT_CLOSE(dev().download(gdr, n), dr, 1e-5);

  const float lam[2] = {0.75f, -1.3f};
  float* glam = dev().upload(std::vector<float>(lam, lam + 2));
  bf16* gy = dev().upload(y);
  cpu().scalar_mix(want.data(), lam, x.data(), lam + 1, y.data(), n);
  gpu().scalar_mix(out, glam, gx, glam + 1, gy, n);
  within_one_unit(dev().download(out, n), want, "scalar_mix");
  std::vector<float> da(n, 0.5f), dbm(n, -0.5f), dlam = {0.1f, 0.2f};
  float* gda = dev().upload(da);
  float* gdbm = dev().upload(dbm);
  float* gdlam = dev().upload(dlam);
  cpu().scalar_mix_backward(da.data(), dbm.data(), dlam.data(), dlam.data() + 1, lam, x.data(),
                            lam + 1, y.data(), dy.data(), n);
  gpu().scalar_mix_backward(gda, gdbm, gdlam, gdlam + 1, glam, gx, glam + 1, gy, dev().upload(dy),
                            n);
  EXPECT_CLOSE(dev().download(gda, n), da, 1e-5);
  EXPECT_CLOSE(dev().download(gdbm, n), dbm, 1e-5);
  EXPECT_CLOSE(dev().download(gdlam, 2), dlam, 1e-4);

  const int64_t B = 2, T = 5, D = 24, V = 9;
  const auto wte = random_vector(V * D, 26), wpe = random_vector(T * D, 27);
  const std::vector<int32_t> tokens = random_ids(B * T, static_cast<int32_t>(V), 28);
  std::vector<bf16> want_e(B * T * D);
  bf16* emb = dev().alloc<bf16>(B * T * D);
  cpu().embedding_forward(want_e.data(), tokens.data(), wte.data(), wpe.data(), B, T, D);
  gpu().embedding_forward(emb, dev().upload(tokens), dev().upload(wte), dev().upload(wpe), B, T, D);
  within_one_unit(dev().download(emb, B * T * D), want_e, "embedding_forward");

  // The combine: token t's K = 2 dispatch rows, a permutation of [0, N K).
  const int64_t K = 2, M = N * K;
  std::vector<int32_t> slot_row(M);
  for (int64_t i = 0; i < M; ++i)
    slot_row[i] = static_cast<int32_t>((i * 61 + 5) % M);
  const auto rows = random_vector(M * C, 29), gate = random_vector(M, 30);
  cpu().combine_rows(want.data(), x.data(), rows.data(), slot_row.data(), gate.data(), N, K, C);
  gpu().combine_rows(out, gx, dev().upload(rows), dev().upload(slot_row), dev().upload(gate), N, K,
                     C);
  within_one_unit(dev().download(out, n), want, "combine_rows");
}

// The same ops where their kernels take other paths: rows of odd length (one element a lane
// instead of packs of 4) and shorter than a warp, pointers off their 16-byte alignment (the bf16
// stream by 2 bytes, the f32 operands by 4), the norms without weight and bias; the mix of one
// input in place (out == a); the combine in place (out == base) over K = 3 rows given out of
// order; the embedding without positions.
TEST_F(CudaVsCpu, Bf16StreamOpsOnOddRowsUnalignedAndInPlace) {
  // Offsets in elements: the f32 operands' (1: the one-float path) and the bf16 stream's (1: a
  // row 2 bytes off, which the packs of 4 over a row of 768 must not mind).
  for (auto [N, C, offset, offset_bf16] : {std::tuple<int64_t, int64_t, int, int>{13, 203, 0, 0},
                                           {9, 6, 1, 1},
                                           {5, 768, 0, 1},
                                           {4, 768, 1, 0}}) {
    SCOPED_TRACE("N " + std::to_string(N) + ", C " + std::to_string(C) + ", offsets " +
                 std::to_string(offset) + " " + std::to_string(offset_bf16));
    const int64_t n = N * C;
    ShiftedScratch at(dev(), offset);
    auto upload_bf16 = [&, offset_bf16 = offset_bf16](const std::vector<bf16>& v) {
      std::vector<bf16> padded(static_cast<size_t>(offset_bf16), bf16{0});
      padded.insert(padded.end(), v.begin(), v.end());
      return dev().upload(padded) + offset_bf16;
    };
    const auto x = bf16_values(random_vector(n, 31, 2.0f));
    const auto w = random_vector(C, 32), b = random_vector(C, 33), dy = random_vector(n, 34);
    const bf16* gx = upload_bf16(x);
    bf16* out = upload_bf16(std::vector<bf16>(n));
    float *gw = at.upload(w), *gb = at.upload(b), *gdy = at.upload(dy);
    float *gm = at.alloc(N), *gr = at.alloc(N);
    std::vector<bf16> want(n);
    std::vector<float> mean(N), rstd(N);
    cpu().layernorm_forward(want.data(), nullptr, nullptr, x.data(), nullptr, nullptr, N, C, 1e-5f);
    gpu().layernorm_forward(out, nullptr, nullptr, gx, nullptr, nullptr, N, C, 1e-5f);
    within_one_unit(dev().download(out, n), want, "layernorm of bf16 without weight and bias");
    cpu().layernorm_forward(want.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N,
                            C, 1e-5f);
    gpu().layernorm_forward(out, gm, gr, gx, gw, gb, N, C, 1e-5f);
    within_one_unit(dev().download(out, n), want, "layernorm of bf16");
    EXPECT_CLOSE(dev().download(gm, N), mean, 1e-5);
    EXPECT_CLOSE(dev().download(gr, N), rstd, 1e-4);
    const auto dx0 = random_vector(n, 35), dw0 = random_vector(C, 36), db0 = random_vector(C, 37);
    auto dx = dx0, dw = dw0, db = db0;
    float *gdx = at.upload(dx0), *gdw = at.upload(dw0), *gdb = at.upload(db0);
    cpu().layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                             mean.data(), rstd.data(), N, C);
    gpu().layernorm_backward(gdx, gdw, gdb, gdy, gx, gw, at.upload(mean), at.upload(rstd), N, C);
    EXPECT_CLOSE(dev().download(gdx, n), dx, 1e-4);
    EXPECT_CLOSE(dev().download(gdw, C), dw, 1e-4);
    EXPECT_CLOSE(dev().download(gdb, C), db, 1e-4);
    cpu().rmsnorm_forward(want.data(), rstd.data(), x.data(), N, C, 1e-6f);
    gpu().rmsnorm_forward(out, gr, gx, N, C, 1e-6f);
    within_one_unit(dev().download(out, n), want, "rmsnorm of bf16");
    EXPECT_CLOSE(dev().download(gr, N), rstd, 1e-4);
    dx = dx0;
    gdx = at.upload(dx0);
    cpu().rmsnorm_backward(dx.data(), dy.data(), x.data(), rstd.data(), N, C);
    gpu().rmsnorm_backward(gdx, gdy, gx, at.upload(rstd), N, C);
    EXPECT_CLOSE(dev().download(gdx, n), dx, 1e-4);

    // The mix of one input, written over it; its backward without b.
    const std::vector<float> lam = {0.7f, -1.3f};
    float* glam = at.upload(lam);
    bf16* mixed = upload_bf16(x);
    std::vector<bf16> want_mix(n);
    cpu().scalar_mix(want_mix.data(), lam.data(), x.data(), lam.data() + 1, nullptr, n);
    gpu().scalar_mix(mixed, glam, mixed, glam + 1, nullptr, n);
    within_one_unit(dev().download(mixed, n), want_mix, "scalar_mix of one input in place");
    std::vector<float> da = dx0, dlam = {0.25f, 0.5f};
    float* gda = at.upload(dx0);
    float* gdlam = at.upload(dlam);
    cpu().scalar_mix_backward(da.data(), nullptr, dlam.data(), dlam.data() + 1, lam.data(),
                              x.data(), lam.data() + 1, nullptr, dy.data(), n);
    gpu().scalar_mix_backward(gda, nullptr, gdlam, gdlam + 1, glam, gx, glam + 1, nullptr, gdy, n);
    EXPECT_CLOSE(dev().download(gda, n), da, 1e-5);
    EXPECT_CLOSE(dev().download(gdlam, 2), dlam, 1e-4);

    // The combine in place: token t's K = 3 dispatch rows, a permutation of [0, N K) that puts
    // them out of ascending order.
    const int64_t K = 3, M = N * K;
    std::vector<int32_t> slot_row(M);
    for (int64_t i = 0; i < M; ++i)
      slot_row[i] = static_cast<int32_t>(M - 1 - (i * 7 + 2) % M);
    const auto rows = random_vector(M * C, 38), gate = random_vector(M, 39);
    bf16* combined = upload_bf16(x);
    cpu().combine_rows(want.data(), x.data(), rows.data(), slot_row.data(), gate.data(), N, K, C);
    gpu().combine_rows(combined, combined, at.upload(rows), dev().upload(slot_row), at.upload(gate),
                       N, K, C);
    within_one_unit(dev().download(combined, n), want, "combine_rows in place");
  }
  const int64_t B = 3, T = 7, D = 13, V = 11;
  const auto wte = random_vector(V * D, 40);
  const std::vector<int32_t> tokens = random_ids(B * T, static_cast<int32_t>(V), 41);
  std::vector<bf16> want_e(B * T * D);
  bf16* emb = dev().alloc<bf16>(B * T * D);
  cpu().embedding_forward(want_e.data(), tokens.data(), wte.data(), nullptr, B, T, D);
  gpu().embedding_forward(emb, dev().upload(tokens), dev().upload(wte), nullptr, B, T, D);
  within_one_unit(dev().download(emb, B * T * D), want_e, "embedding_forward without positions");
}

TEST_F(CudaVsCpu, Bf16GemmWithinTheAccumulationOrderBar) {
  uint64_t seed = 300;
  double worst = 0;
  for (const GemmArgs& args : low_precision_gemm_cases()) {
    const GemmArgs g = resolve_gemm_args(args);
    auto to_bf16 = [&](const std::vector<float>& v) {
      std::vector<bf16> out(v.size());
      cpu().f32_to_bf16(out.data(), v.data(), static_cast<int64_t>(v.size()));
      return out;
    };
    const int64_t rows_a = g.trans_a ? g.k : g.m, rows_b = g.trans_b ? g.n : g.k;
    const auto a = to_bf16(random_vector(g.stride_a * (g.batch - 1) + rows_a * g.lda, seed++));
    const auto b = to_bf16(random_vector(g.stride_b * (g.batch - 1) + rows_b * g.ldb, seed++));
    const auto c0 = random_vector(g.stride_c * (g.batch - 1) + g.m * g.ldc, seed++);
    auto c_cpu = c0;
    cpu().gemm(g, a.data(), b.data(), c_cpu.data());
    float* dc = dev().upload(c0);
    gpu().gemm(g, dev().upload(a), dev().upload(b), dc);
    const double w =
        test::worst_over_gemm_bar<bf16>(g, a, b, c0, dev().download(dc, c0.size()), c_cpu,
                                        &kmath::float_from_bf16, accumulation_bar(g));
    EXPECT_LE(w, 1.0) << "m " << g.m << " n " << g.n << " k " << g.k << " batch " << g.batch;
    worst = std::max(worst, w);
  }
  std::printf("[ measured ] bf16 GEMM, gpu vs cpu: %.3g of the accumulation-order bar\n", worst);
}

// TF32 rounds each f32 input to 10 mantissa bits (unit roundoff 2^-11), so a product moves by at
// most 2^-10 + 2^-22 relative on top of the accumulation bar; the CPU computes f32 (tf32 is a
// GPU format) and must ignore the flag.
TEST_F(CudaVsCpu, Tf32GemmWithinItsInputRoundingBar) {
  uint64_t seed = 400;
  double worst = 0;
  for (GemmArgs args : low_precision_gemm_cases()) {
    const GemmArgs g = resolve_gemm_args(args);
    const int64_t rows_a = g.trans_a ? g.k : g.m, rows_b = g.trans_b ? g.n : g.k;
    const auto a = random_vector(g.stride_a * (g.batch - 1) + rows_a * g.lda, seed++);
    const auto b = random_vector(g.stride_b * (g.batch - 1) + rows_b * g.ldb, seed++);
    const auto c0 = random_vector(g.stride_c * (g.batch - 1) + g.m * g.ldc, seed++);
    GemmArgs t = g;
    t.tf32 = true;
    auto c_cpu = c0, c_cpu_tf32 = c0;
    cpu().gemm(g, a.data(), b.data(), c_cpu.data());
    cpu().gemm(t, a.data(), b.data(), c_cpu_tf32.data());
    EXPECT_EQ(c_cpu_tf32, c_cpu) << "the CPU has no TF32";
    float* dc = dev().upload(c0);
    gpu().gemm(t, dev().upload(a), dev().upload(b), dc);
    const double w = test::worst_over_gemm_bar<float>(
        g, a, b, c0, dev().download(dc, c0.size()), c_cpu, [](float v) { return v; },
        accumulation_bar(g) + 0x1p-10 + 0x1p-22);
    EXPECT_LE(w, 1.0) << "m " << g.m << " n " << g.n << " k " << g.k;
    worst = std::max(worst, w);
  }
  std::printf("[ measured ] TF32 GEMM, gpu vs cpu f32: %.3g of the bar\n", worst);
}

TEST_F(CudaVsCpu, CopyOfOverlappingRangesIsAMemmove) {
  auto host = random_vector(100, 90);
  for (int shift : {7, -7}) {
    float* d = dev().upload(host);
    std::vector<float> want = host;
    float* dst = shift > 0 ? d + shift : d;
    const float* src = shift > 0 ? d : d - shift;
    float* hdst = shift > 0 ? want.data() + shift : want.data();
    const float* hsrc = shift > 0 ? want.data() : want.data() - shift;
    cpu().copy(hdst, hsrc, 90 * sizeof(float));
    gpu().copy(dst, src, 90 * sizeof(float));
    EXPECT_EQ(dev().download(d, 100), want) << "shift " << shift;
  }
}

TEST_F(CudaVsCpu, ABadDeviceIndexLeavesNoErrorBehind) {
  // The constructor must refuse the index before anything touches the device, so the next
  // checked call on a good backend does not report the stale error.
  EXPECT_THROW(make_cuda_backend(1 << 20), Error);
  check_gemm(cpu(), gpu(), dev(), {.m = 7, .n = 5, .k = 3}, 100);
}

// ---- elementwise --------------------------------------------------------------------------------

TEST_F(CudaVsCpu, Elementwise) {
  // 1537 moves one float at a time, 1536 16-byte packs.
  for (const int64_t n : {int64_t{1537}, int64_t{1536}}) {
    SCOPED_TRACE("n " + std::to_string(n));
    auto x = random_vector(n, 1), y = random_vector(n, 2), g = random_vector(n, 3);
    {
      std::vector<float> want(n);
      cpu().add(want.data(), x.data(), y.data(), n);
      float* out = dev().alloc<float>(n);
      gpu().add(out, dev().upload(x), dev().upload(y), n);
      EXPECT_CLOSE(dev().download(out, n), want, 1e-6);
    }
    {
      auto want = x;
      cpu().scale(want.data(), -1.75f, n);
      float* d = dev().upload(x);
      gpu().scale(d, -1.75f, n);
      EXPECT_CLOSE(dev().download(d, n), want, 1e-6);
    }
    {
      auto want = y;
      cpu().axpby(want.data(), 0.3f, x.data(), -0.9f, n);
      float* d = dev().upload(y);
      gpu().axpby(d, 0.3f, dev().upload(x), -0.9f, n);
      EXPECT_CLOSE(dev().download(d, n), want, 1e-6);
    }
    using Fwd = void (Backend::*)(float*, const float*, int64_t);
    using Bwd = void (Backend::*)(float*, const float*, const float*, int64_t);
    const std::pair<Fwd, Bwd> activations[] = {
        {&Backend::gelu_forward, &Backend::gelu_backward},
        {&Backend::gelu_erf_forward, &Backend::gelu_erf_backward},
        {&Backend::relu2_forward, &Backend::relu2_backward}};
    for (auto [fwd, bwd] : activations) {
      std::vector<float> want(n);
      (cpu().*fwd)(want.data(), x.data(), n);
      float* out = dev().alloc<float>(n);
      (gpu().*fwd)(out, dev().upload(x), n);
      EXPECT_CLOSE(dev().download(out, n), want, 1e-5);
      auto dwant = y;  // backward accumulates
      (cpu().*bwd)(dwant.data(), x.data(), g.data(), n);
      float* din = dev().upload(y);
      (gpu().*bwd)(din, dev().upload(x), dev().upload(g), n);
      EXPECT_CLOSE(dev().download(din, n), dwant, 1e-5);
    }
    double ss_cpu = cpu().sum_squares(x.data(), n);
    double ss_gpu = gpu().sum_squares(dev().upload(x), n);
    EXPECT_NEAR(ss_gpu, ss_cpu, 1e-9 * ss_cpu);
  }
}

TEST_F(CudaVsCpu, Bias) {
  // 1100: 3 row chunks of the gradient; 70: no multiple of 4; 70000 rows: past the grid's y
  // limit (65535), so blocks take several rows.
  for (auto [N, C] : {std::pair<int64_t, int64_t>{37, 70}, {1100, 24}, {70000, 8}}) {
    auto out = random_vector(N * C, 1), bias = random_vector(C, 2), dbias = random_vector(C, 3);
    auto want = out;
    cpu().add_bias(want.data(), bias.data(), N, C);
    float* d = dev().upload(out);
    gpu().add_bias(d, dev().upload(bias), N, C);
    EXPECT_CLOSE(dev().download(d, N * C), want, 1e-6);
    ShiftedScratch shifted(dev(), 1);
    float* ds = shifted.upload(out);
    gpu().add_bias(ds, shifted.upload(bias), N, C);
    EXPECT_CLOSE(dev().download(ds, N * C), want, 1e-6);
    auto dwant = dbias;
    cpu().bias_backward(dwant.data(), out.data(), N, C);
    float* db = dev().upload(dbias);
    gpu().bias_backward(db, dev().upload(out), N, C);
    EXPECT_CLOSE(dev().download(db, C), dwant, 1e-4);
  }
}

// ---- normalisation ------------------------------------------------------------------------------

TEST_F(CudaVsCpu, LayerNorm) {
  // C = 13 and 770 are not multiples of 4 (one float at a time); 1100 rows end inside a block.
  const std::pair<int64_t, int64_t> shapes[] = {{7, 12},    {33, 768}, {3, 1000},
                                                {1100, 20}, {5, 13},   {9, 770}};
  for (int offset : {0, 1}) {
    ShiftedScratch at(dev(), offset);
    for (auto [N, C] : shapes) {
      SCOPED_TRACE("N " + std::to_string(N) + ", C " + std::to_string(C) + ", offset " +
                   std::to_string(offset));
      auto x = random_vector(N * C, 1, 2.0f), w = random_vector(C, 2), b = random_vector(C, 3);
      auto dy = random_vector(N * C, 4);
      auto dx0 = random_vector(N * C, 5), dw0 = random_vector(C, 6), db0 = random_vector(C, 7);
      std::vector<float> y(N * C), mean(N), rstd(N);
      cpu().layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N,
                              C, 1e-5f);
      float *gy = at.alloc(N * C), *gm = at.alloc(N), *gr = at.alloc(N);
      float *gx = at.upload(x), *gw = at.upload(w);
      gpu().layernorm_forward(gy, gm, gr, gx, gw, at.upload(b), N, C, 1e-5f);
      EXPECT_CLOSE(dev().download(gy, N * C), y, 1e-4);
      EXPECT_CLOSE(dev().download(gm, N), mean, 1e-5);
      EXPECT_CLOSE(dev().download(gr, N), rstd, 1e-4);
      auto dx = dx0, dw = dw0, db = db0;
      cpu().layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), x.data(), w.data(),
                               mean.data(), rstd.data(), N, C);
      float *gdx = at.upload(dx0), *gdw = at.upload(dw0), *gdb = at.upload(db0);
      gpu().layernorm_backward(gdx, gdw, gdb, at.upload(dy), gx, gw, gm, gr, N, C);
      EXPECT_CLOSE(dev().download(gdx, N * C), dx, 1e-4);
      EXPECT_CLOSE(dev().download(gdw, C), dw, 1e-4);
      EXPECT_CLOSE(dev().download(gdb, C), db, 1e-4);
      // Without weight and bias (the plain normalisation).
      std::vector<float> y0(N * C);
      cpu().layernorm_forward(y0.data(), nullptr, nullptr, x.data(), nullptr, nullptr, N, C, 1e-5f);
      gpu().layernorm_forward(gy, nullptr, nullptr, gx, nullptr, nullptr, N, C, 1e-5f);
      EXPECT_CLOSE(dev().download(gy, N * C), y0, 1e-4);
    }
  }
}

TEST_F(CudaVsCpu, RmsNormAndSoftmax) {
  // {37, 13}: a row length that is no multiple of 4; offset 1: every pointer off 16 bytes.
  for (auto [N, C, offset] : {std::tuple<int64_t, int64_t, int>{7, 12, 0},
                              {33, 768, 0},
                              {5, 64, 0},
                              {37, 13, 0},
                              {33, 768, 1}}) {
    SCOPED_TRACE("N " + std::to_string(N) + ", C " + std::to_string(C) + ", offset " +
                 std::to_string(offset));
    ShiftedScratch at(dev(), offset);
    auto x = random_vector(N * C, 1, 2.0f), dy = random_vector(N * C, 2);
    auto dx0 = random_vector(N * C, 3);
    std::vector<float> y(N * C), rstd(N);
    cpu().rmsnorm_forward(y.data(), rstd.data(), x.data(), N, C, 1e-6f);
    float *gy = at.alloc(N * C), *gr = at.alloc(N), *gx = at.upload(x);
    gpu().rmsnorm_forward(gy, gr, gx, N, C, 1e-6f);
    EXPECT_CLOSE(dev().download(gy, N * C), y, 1e-4);
    EXPECT_CLOSE(dev().download(gr, N), rstd, 1e-4);
    auto dx = dx0;
    cpu().rmsnorm_backward(dx.data(), dy.data(), x.data(), rstd.data(), N, C);
    float* gdx = at.upload(dx0);
    float* gdy = at.upload(dy);
    gpu().rmsnorm_backward(gdx, gdy, gx, gr, N, C);
    EXPECT_CLOSE(dev().download(gdx, N * C), dx, 1e-4);

    std::vector<float> p(N * C);
    cpu().softmax_forward(p.data(), x.data(), N, C);
    float* gp = dev().alloc<float>(N * C);
    gpu().softmax_forward(gp, gx, N, C);
    EXPECT_CLOSE(dev().download(gp, N * C), p, 1e-5);
    auto ds = dx0;
    cpu().softmax_backward(ds.data(), dy.data(), p.data(), N, C);
    float* gds = dev().upload(dx0);
    gpu().softmax_backward(gds, gdy, gp, N, C);
    EXPECT_CLOSE(dev().download(gds, N * C), ds, 1e-5);
  }
}

// ---- embeddings and attention layout ------------------------------------------------------------

TEST_F(CudaVsCpu, Embedding) {
  const int64_t B = 3, T = 7, D = 12, V = 5;  // V < B*T: tokens repeat, the backward must add up
  auto tokens = random_ids(B * T, V, 1);
  auto wte = random_vector(V * D, 2), wpe = random_vector(T * D, 3);
  auto dout = random_vector(B * T * D, 4);
  auto dwte0 = random_vector(V * D, 5), dwpe0 = random_vector(T * D, 6);
  int32_t* gt = dev().upload(tokens);
  float *gwte = dev().upload(wte), *gwpe = dev().upload(wpe);
  for (bool with_pos : {false, true}) {
    std::vector<float> out(B * T * D);
    cpu().embedding_forward(out.data(), tokens.data(), wte.data(), with_pos ? wpe.data() : nullptr,
                            B, T, D);
    float* gout = dev().alloc<float>(B * T * D);
    gpu().embedding_forward(gout, gt, gwte, with_pos ? gwpe : nullptr, B, T, D);
    EXPECT_CLOSE(dev().download(gout, B * T * D), out, 1e-6);
    auto dwte = dwte0, dwpe = dwpe0;
    cpu().embedding_backward(dwte.data(), with_pos ? dwpe.data() : nullptr, dout.data(),
                             tokens.data(), B, T, D);
    float *gdwte = dev().upload(dwte0), *gdwpe = dev().upload(dwpe0);
    gpu().embedding_backward(gdwte, with_pos ? gdwpe : nullptr, dev().upload(dout), gt, B, T, D);
    EXPECT_CLOSE(dev().download(gdwte, V * D), dwte, 1e-5);
    EXPECT_CLOSE(dev().download(gdwpe, T * D), dwpe, 1e-5);
  }
}

// Record #89's bigram hash (ids equal: integer math), sign trick (exact: products with +-1) and
// the hash's large products wrapping in int32 on both devices (token ids up to 50303).
TEST_F(CudaVsCpu, BigramHashAndSigns) {
  const int64_t B = 3, T = 9, D = 20, rows = 377280, sign_rows = 8192;
  const auto tokens = random_ids(B * T, 50304, 31);
  std::vector<int32_t> ids(B * T);
  cpu().bigram_hash(ids.data(), tokens.data(), B, T, rows);
  int32_t* gt = dev().upload(tokens);
  int32_t* gids = dev().alloc<int32_t>(B * T);
  gpu().bigram_hash(gids, gt, B, T, rows);
  EXPECT_EQ(dev().download(gids, B * T), ids);
  for (int64_t b = 0; b < B; ++b)
    EXPECT_EQ(ids[b * T], rows - 1);  // each row starts at the reserved last row
  std::vector<float> signs(sign_rows * D);
  for (size_t i = 0; i < signs.size(); ++i)
    signs[i] = (i * 7919) % 3 == 0 ? -1.0f : 1.0f;
  auto x = random_vector(B * T * D, 32);
  float* gx = dev().upload(x);
  cpu().bigram_signs(x.data(), tokens.data(), signs.data(), B, T, D, sign_rows);
  gpu().bigram_signs(gx, gt, dev().upload(signs), B, T, D, sign_rows);
  EXPECT_EQ(dev().download(gx, B * T * D), x);
}

// Record #34's smear, forward and backward (the gate's dots reduced in another order on the GPU).
TEST_F(CudaVsCpu, Smear) {
  const int64_t B = 2, T = 7, D = 40, K = 12;
  const auto x = random_vector(B * T * D, 41), w = random_vector(K, 42),
             dout = random_vector(B * T * D, 43);
  const std::vector<float> lambda = {0.7f};
  std::vector<float> out(B * T * D), gate(B * T), dx(B * T * D), dw = random_vector(K, 44),
                                                                 dlambda = {0.25f};
  const auto dw0 = dw, dlambda0 = dlambda;
  cpu().smear_forward(out.data(), gate.data(), x.data(), w.data(), lambda.data(), B, T, D, K);
  cpu().smear_backward(dx.data(), dw.data(), dlambda.data(), x.data(), w.data(), lambda.data(),
                       gate.data(), dout.data(), B, T, D, K);
  float *gx = dev().upload(x), *gw = dev().upload(w), *gl = dev().upload(lambda);
  float *gout = dev().alloc<float>(B * T * D), *ggate = dev().alloc<float>(B * T);
  gpu().smear_forward(gout, ggate, gx, gw, gl, B, T, D, K);
  EXPECT_CLOSE(dev().download(gout, B * T * D), out, 1e-6);
  EXPECT_CLOSE(dev().download(ggate, B * T), gate, 1e-6);
  float *gdx = dev().alloc<float>(B * T * D), *gdw = dev().upload(dw0),
        *gdl = dev().upload(dlambda0);
  gpu().smear_backward(gdx, gdw, gdl, gx, gw, gl, ggate, dev().upload(dout), B, T, D, K);
  EXPECT_CLOSE(dev().download(gdx, B * T * D), dx, 1e-5);
  EXPECT_CLOSE(dev().download(gdw, K), dw, 1e-5);
  EXPECT_CLOSE(dev().download(gdl, 1), dlambda, 1e-5);
}

// Record #89's gated injection with one coefficient (stride 0) and one per row, f32 and bf16
// streams.
TEST_F(CudaVsCpu, CoefAdd) {
  const int64_t N = 37, D = 24;
  const auto x = random_vector(N * D, 51), src = random_vector(N * D, 52),
             dout = random_vector(N * D, 53);
  const auto coefs = random_vector(N * 3, 54);
  for (int64_t stride : {int64_t{0}, int64_t{3}}) {
    SCOPED_TRACE("stride " + std::to_string(stride));
    std::vector<float> out(N * D), dsrc = random_vector(N * D, 55), dc = random_vector(N * 3, 56);
    const auto dsrc0 = dsrc, dc0 = dc;
    cpu().coef_add(out.data(), x.data(), coefs.data(), stride, src.data(), N, D);
    cpu().coef_add_backward(dsrc.data(), dc.data(), coefs.data(), stride, src.data(), dout.data(),
                            N, D);
    float *gc = dev().upload(coefs), *gsrc = dev().upload(src);
    float* gout = dev().alloc<float>(N * D);
    gpu().coef_add(gout, dev().upload(x), gc, stride, gsrc, N, D);
    EXPECT_CLOSE(dev().download(gout, N * D), out, 1e-6);
    float *gdsrc = dev().upload(dsrc0), *gdc = dev().upload(dc0);
    gpu().coef_add_backward(gdsrc, gdc, gc, stride, gsrc, dev().upload(dout), N, D);
    EXPECT_CLOSE(dev().download(gdsrc, N * D), dsrc, 1e-5);
    EXPECT_CLOSE(dev().download(gdc, N * 3), dc, 1e-5);
    std::vector<bf16> xb(N * D), outb(N * D);
    cpu().f32_to_bf16(xb.data(), x.data(), N * D);
    cpu().coef_add(outb.data(), xb.data(), coefs.data(), stride, src.data(), N, D);
    bf16* goutb = dev().alloc<bf16>(N * D);
    gpu().coef_add(goutb, dev().upload(xb), gc, stride, gsrc, N, D);
    within_one_unit(dev().download(goutb, N * D), outb, "coef_add bf16");
  }
}

TEST_F(CudaVsCpu, SplitAndMergeHeads) {
  // hd 4 and 64 move 16-byte packs, hd 6 and the shifted pointers one float at a time.
  for (auto [B, T, H, hd, offset] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t, int>{2, 7, 3, 4, 0},
        {2, 5, 3, 64, 0},
        {1, 9, 2, 6, 0},
        {2, 5, 3, 64, 1}}) {
    SCOPED_TRACE("B " + std::to_string(B) + ", T " + std::to_string(T) + ", H " +
                 std::to_string(H) + ", hd " + std::to_string(hd) + ", offset " +
                 std::to_string(offset));
    ShiftedScratch at(dev(), offset);
    const int64_t n = B * T * H * hd;
    auto qkv = random_vector(3 * n, 1);
    std::vector<float> q(n), k(n), v(n);
    cpu().split_heads(q.data(), k.data(), v.data(), qkv.data(), B, T, H, hd);
    float *gq = at.alloc(n), *gk = at.alloc(n), *gv = at.alloc(n);
    gpu().split_heads(gq, gk, gv, at.upload(qkv), B, T, H, hd);
    EXPECT_CLOSE(dev().download(gq, n), q, 0.0);
    EXPECT_CLOSE(dev().download(gk, n), k, 0.0);
    EXPECT_CLOSE(dev().download(gv, n), v, 0.0);
    auto dqkv0 = random_vector(3 * n, 2);
    auto dqkv = dqkv0;
    cpu().split_heads_backward(dqkv.data(), q.data(), k.data(), v.data(), B, T, H, hd);
    float* gdqkv = at.upload(dqkv0);
    gpu().split_heads_backward(gdqkv, gq, gk, gv, B, T, H, hd);
    EXPECT_CLOSE(dev().download(gdqkv, 3 * n), dqkv, 1e-6);

    std::vector<float> merged(n);
    cpu().merge_heads(merged.data(), q.data(), B, T, H, hd);
    float* gm = at.alloc(n);
    gpu().merge_heads(gm, gq, B, T, H, hd);
    EXPECT_CLOSE(dev().download(gm, n), merged, 0.0);
    auto da0 = random_vector(n, 3);
    auto da = da0;
    cpu().merge_heads_backward(da.data(), merged.data(), B, T, H, hd);
    float* gda = at.upload(da0);
    gpu().merge_heads_backward(gda, gm, B, T, H, hd);
    EXPECT_CLOSE(dev().download(gda, n), da, 1e-6);
  }
}

TEST_F(CudaVsCpu, Rotary) {
  const int64_t BH = 6, T = 9, hd = 8, n = BH * T * hd;
  auto x = random_vector(n, 1), dy = random_vector(n, 2), dx0 = random_vector(n, 3);
  std::vector<float> y(n);
  cpu().rotary_forward(y.data(), x.data(), BH, T, hd, 10000.0f);
  float* gx = dev().upload(x);
  float* gy = dev().alloc<float>(n);
  gpu().rotary_forward(gy, gx, BH, T, hd, 10000.0f);
  EXPECT_CLOSE(dev().download(gy, n), y, 1e-5);
  gpu().rotary_forward(gx, gx, BH, T, hd, 10000.0f);  // in place
  EXPECT_CLOSE(dev().download(gx, n), y, 1e-5);
  auto dx = dx0;
  cpu().rotary_backward(dx.data(), dy.data(), BH, T, hd, 10000.0f);
  float* gdx = dev().upload(dx0);
  gpu().rotary_backward(gdx, dev().upload(dy), BH, T, hd, 10000.0f);
  EXPECT_CLOSE(dev().download(gdx, n), dx, 1e-5);
}

// The modern blocks' fused split, QK-norm and rotary against the CPU's (which is the unfused ops
// bit for bit, CpuBackend.QkNormRotaryIsTheUnfusedOpsBitForBit): the norm's sum in a warp's order
// and the rotation's sin and cos on the device move the last bits. d qkv f32 and bf16, filled
// with NaNs first (every element written). `variant`: record #89's paired positions (head h of
// token t at 2t + h mod 2) with a table of (YaRN) frequencies.
TEST_F(CudaVsCpu, QkNormRotary) {
  for (auto [B, T, H, hd, truncated, variant] :
       {std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool>{2, 9, 3, 8, false, false},
        {2, 70, 4, 64, true, false},
        {1, 5, 2, 128, false, false},
        {2, 9, 4, 8, true, true},
        {2, 70, 6, 64, true, true}}) {
    SCOPED_TRACE("hd " + std::to_string(hd) + (truncated ? " truncated" : "") +
                 (variant ? " paired, a frequency table" : ""));
    const int64_t N = B * T, D = H * hd, n = N * D, rows = N * H;
    const float eps = 1e-6f, base = truncated ? 1024.0f : 10000.0f;
    const auto qkv = random_vector(N * 3 * D, 21, 3.0f);
    std::vector<float> freq(static_cast<size_t>(hd / 2));
    for (int64_t j = 0; j < hd / 2; ++j)
      freq[j] = 0.7f * kmath::rotary_inv_freq(j, hd / 2, base, truncated);
    const core::RotaryVariant cpu_variant =
        variant ? core::RotaryVariant{freq.data(), true} : core::RotaryVariant{};
    const core::RotaryVariant gpu_variant =
        variant ? core::RotaryVariant{dev().upload(freq), true} : core::RotaryVariant{};
    std::vector<float> q(n), k(n), v(n), qr(n), kr(n), qs(rows), ks(rows);
    cpu().qk_norm_rotary_forward(qr.data(), kr.data(), q.data(), k.data(), v.data(), qs.data(),
                                 ks.data(), qkv.data(), B, T, H, hd, eps, base, truncated,
                                 cpu_variant);
    float *gq = dev().alloc<float>(n), *gk = dev().alloc<float>(n), *gv = dev().alloc<float>(n),
          *gqr = dev().alloc<float>(n), *gkr = dev().alloc<float>(n),
          *gqs = dev().alloc<float>(rows), *gks = dev().alloc<float>(rows);
    gpu().qk_norm_rotary_forward(gqr, gkr, gq, gk, gv, gqs, gks, dev().upload(qkv), B, T, H, hd,
                                 eps, base, truncated, gpu_variant);
    EXPECT_EQ(dev().download(gq, n), q);
    EXPECT_EQ(dev().download(gk, n), k);
    EXPECT_EQ(dev().download(gv, n), v);
    EXPECT_CLOSE(dev().download(gqr, n), qr, 1e-5);
    EXPECT_CLOSE(dev().download(gkr, n), kr, 1e-5);
    EXPECT_CLOSE(dev().download(gqs, rows), qs, 1e-5);
    EXPECT_CLOSE(dev().download(gks, rows), ks, 1e-5);
    const auto dqr = random_vector(n, 22), dkr = random_vector(n, 23), dv = random_vector(n, 24);
    std::vector<float> dqkv(N * 3 * D);
    cpu().qk_norm_rotary_backward(dqkv.data(), dqr.data(), dkr.data(), dv.data(), q.data(),
                                  k.data(), qs.data(), ks.data(), B, T, H, hd, base, truncated,
                                  cpu_variant);
    float* gd = dev().upload(std::vector<float>(N * 3 * D, std::nanf("")));
    const float *gdqr = dev().upload(dqr), *gdkr = dev().upload(dkr), *gdv = dev().upload(dv),
                *gqc = dev().upload(q), *gkc = dev().upload(k), *gqsc = dev().upload(qs),
                *gksc = dev().upload(ks);
    gpu().qk_norm_rotary_backward(gd, gdqr, gdkr, gdv, gqc, gkc, gqsc, gksc, B, T, H, hd, base,
                                  truncated, gpu_variant);
    EXPECT_CLOSE(dev().download(gd, N * 3 * D), dqkv, 1e-4);
    std::vector<bf16> dqkv_b(N * 3 * D);
    cpu().qk_norm_rotary_backward(dqkv_b.data(), dqr.data(), dkr.data(), dv.data(), q.data(),
                                  k.data(), qs.data(), ks.data(), B, T, H, hd, base, truncated,
                                  cpu_variant);
    bf16* gdb = dev().upload(std::vector<bf16>(N * 3 * D, bf16{0x7FC1}));
    gpu().qk_norm_rotary_backward(gdb, gdqr, gdkr, gdv, gqc, gkc, gqsc, gksc, B, T, H, hd, base,
                                  truncated, gpu_variant);
    const std::vector<bf16> got = dev().download(gdb, N * 3 * D);
    std::vector<float> got_f(got.size()), want_f(got.size());
    for (size_t i = 0; i < got.size(); ++i) {
      got_f[i] = kmath::float_from_bf16(got[i]);
      want_f[i] = kmath::float_from_bf16(dqkv_b[i]);
    }
    EXPECT_CLOSE(got_f, want_f, 1e-2);  // a value near a bf16 tie may round the other way
  }
}

// The record's half-truncated rotary (model.rotary_truncate), forward and backward.
TEST_F(CudaVsCpu, RotaryTruncated) {
  const int64_t BH = 4, T = 11, hd = 16, n = BH * T * hd;
  auto x = random_vector(n, 4), dy = random_vector(n, 5), dx0 = random_vector(n, 6);
  std::vector<float> y(n);
  cpu().rotary_forward(y.data(), x.data(), BH, T, hd, 1024.0f, true);
  float* gy = dev().alloc<float>(n);
  gpu().rotary_forward(gy, dev().upload(x), BH, T, hd, 1024.0f, true);
  EXPECT_CLOSE(dev().download(gy, n), y, 1e-5);
  auto dx = dx0;
  cpu().rotary_backward(dx.data(), dy.data(), BH, T, hd, 1024.0f, true);
  float* gdx = dev().upload(dx0);
  gpu().rotary_backward(gdx, dev().upload(dy), BH, T, hd, 1024.0f, true);
  EXPECT_CLOSE(dev().download(gdx, n), dx, 1e-5);
}

// FP8 encoding (the record's head) is the same function on both: equal bytes, from f32 and
// from bf16.
TEST_F(CudaVsCpu, Fp8Encode) {
  const int64_t n = 4099;
  auto x = random_vector(n, 7);
  for (int64_t i = 0; i < n; ++i)
    x[i] *= std::ldexp(1.0f, static_cast<int>(i % 40) - 20);
  std::vector<bf16> xb(n);
  for (int64_t i = 0; i < n; ++i)
    xb[i] = kmath::bf16_from_float(x[i]);
  auto bits = [](const std::vector<fp8>& v) {
    std::vector<uint8_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      b[i] = v[i].bits;
    return b;
  };
  for (auto format : {kmath::Fp8::E4M3, kmath::Fp8::E5M2}) {
    std::vector<fp8> want(n), want_bf16(n);
    cpu().fp8_encode(want.data(), x.data(), n, 0.37f, format);
    cpu().fp8_encode(want_bf16.data(), xb.data(), n, 0.37f, format);
    fp8* g = dev().alloc<fp8>(n);
    gpu().fp8_encode(g, dev().upload(x), n, 0.37f, format);
    EXPECT_EQ(bits(dev().download(g, n)), bits(want));
    gpu().fp8_encode(g, dev().upload(xb), n, 0.37f, format);
    EXPECT_EQ(bits(dev().download(g, n)), bits(want_bf16));
  }
}

// gemm_fp8 on the device against the CPU in the FP8 head's three products (model/gpt.cpp):
// logits = a Xq Wq^T (fast accumulation, as the record's forward), d x = a G Wq and d W += a G^T Xq
// (both need a byte transpose for cuBLASLt), at a shape cuBLASLt's FP8 kernels take (every
// dimension a multiple of 16) and one they do not (the TF32 form), with ENGINE_CUDA_FP8_GEMM
// unset and =tf32. Each element within tol * a sum |a b| (the f32 sums in another order: 1e-5;
// fast accumulation keeps partial sums in fewer bits: 1e-2) of the CPU's.
TEST_F(CudaVsCpu, Fp8GemmHeadProducts) {
  struct Shape {
    int64_t N, D, Vp;
  };
  const float xs = 0.02f, ws = 24.0f / 448.0f, gs = 1.0f / 448.0f;
  for (const char* mode : {"", "tf32"}) {
    setenv("ENGINE_CUDA_FP8_GEMM", mode, 1);
    for (Shape s : {Shape{256, 128, 384}, Shape{37, 40, 136}}) {
      const int64_t N = s.N, D = s.D, Vp = s.Vp;
      std::vector<fp8> xq(N * D), wq(Vp * D), gq(N * Vp);
      cpu().fp8_encode(xq.data(), random_vector(N * D, 21).data(), N * D, xs, kmath::Fp8::E4M3);
      cpu().fp8_encode(wq.data(), random_vector(Vp * D, 22, 0.3f).data(), Vp * D, ws,
                       kmath::Fp8::E4M3);
      cpu().fp8_encode(gq.data(), random_vector(N * Vp, 23, 0.002f).data(), N * Vp, gs,
                       kmath::Fp8::E5M2);
      GemmArgs fwd, dx, dw;
      fwd.trans_b = true, fwd.m = N, fwd.n = Vp, fwd.k = D, fwd.alpha = 1.3f * xs * ws;
      fwd.fp8_fast_accum = true;
      dx.m = N, dx.n = D, dx.k = Vp, dx.alpha = gs * ws;
      dw.trans_a = true, dw.m = Vp, dw.n = D, dw.k = N, dw.alpha = gs * xs, dw.beta = 1.0f;
      struct Product {
        const char* name;
        GemmArgs args;
        const std::vector<fp8>& a;
        kmath::Fp8 a_format;
        const std::vector<fp8>& b;
      };
      const Product products[] = {{"forward", fwd, xq, kmath::Fp8::E4M3, wq},
                                  {"d x", dx, gq, kmath::Fp8::E5M2, wq},
                                  {"d W", dw, gq, kmath::Fp8::E5M2, xq}};
      for (const Product& p : products) {
        const int64_t size = p.args.m * p.args.n;
        const std::vector<float> c0 = random_vector(size, 24);
        std::vector<float> want = c0;
        cpu().gemm_fp8(p.args, p.a.data(), p.a_format, p.b.data(), kmath::Fp8::E4M3, want.data());
        float* c = dev().upload(c0);
        gpu().gemm_fp8(p.args, dev().upload(p.a), p.a_format, dev().upload(p.b), kmath::Fp8::E4M3,
                       c);
        const std::vector<float> got = dev().download(c, size);
        // |alpha| sum |a b|: the f32 GEMM of the decoded magnitudes.
        auto magnitudes = [](const std::vector<fp8>& v, kmath::Fp8 format) {
          std::vector<float> m(v.size());
          for (size_t i = 0; i < v.size(); ++i)
            m[i] = std::fabs(kmath::float_from_fp8(v[i], format));
          return m;
        };
        GemmArgs abs_args = p.args;
        abs_args.alpha = std::fabs(p.args.alpha), abs_args.beta = 0.0f;
        std::vector<float> bound(size);
        cpu().gemm(abs_args, magnitudes(p.a, p.a_format).data(),
                   magnitudes(p.b, kmath::Fp8::E4M3).data(), bound.data());
        const double tol = p.args.fp8_fast_accum && *mode == '\0' ? 1e-2 : 1e-5;
        double worst = 0;
        for (int64_t i = 0; i < size; ++i)
          worst = std::max(worst, std::fabs(double(got[i]) - want[i]) /
                                      (double(bound[i]) + 1e-6 * std::fabs(c0[i]) + 1e-30));
        EXPECT_LE(worst, tol) << p.name << " N=" << N << " D=" << D << " Vp=" << Vp
                              << " ENGINE_CUDA_FP8_GEMM=" << mode;
      }
    }
  }
  unsetenv("ENGINE_CUDA_FP8_GEMM");
  setenv("ENGINE_CUDA_FP8_GEMM", "fp16", 1);
  std::vector<fp8> a(256), b(256);
  GemmArgs g;
  g.trans_b = true, g.m = 16, g.n = 16, g.k = 16;
  float* c = dev().alloc<float>(256);
  EXPECT_THROW(
      gpu().gemm_fp8(g, dev().upload(a), kmath::Fp8::E4M3, dev().upload(b), kmath::Fp8::E4M3, c),
      Error);
  unsetenv("ENGINE_CUDA_FP8_GEMM");
}

// model.mlp_fp8's device scales on the GPU against the CPU: abs_max (f32 and bf16, across many
// blocks) and fp8_scale_from_amax equal, fp8_encode_scaled equal bytes, gemm_fp8_scaled within
// the fast-accumulation bar of Fp8GemmHeadProducts at the MLP's shapes (multiples of 16: the
// scales as cuBLASLt's scale pointers) and an odd one (the TF32 form, the scales read back), with
// and without ENGINE_CUDA_FP8_GEMM=tf32.
TEST_F(CudaVsCpu, Fp8ScalingOpsMatchTheCpu) {
  const int64_t n = 300001;
  auto x = random_vector(n, 31);
  x[n / 3] = -7.5f;
  std::vector<bf16> xb(n);
  for (int64_t i = 0; i < n; ++i)
    xb[i] = kmath::bf16_from_float(x[i]);
  float want = 0, want_bf16 = 0;
  cpu().abs_max(&want, x.data(), n);
  cpu().abs_max(&want_bf16, xb.data(), n);
  float* g = dev().alloc<float>(2);
  gpu().abs_max(g, dev().upload(x), n);
  gpu().abs_max(g + 1, dev().upload(xb), n);
  const std::vector<float> amax = dev().download(g, 2);
  EXPECT_EQ(amax[0], want);
  EXPECT_EQ(amax[1], want_bf16);
  gpu().fp8_scale_from_amax(g, g, 2, 1.80f / 448.0f);
  const std::vector<float> scales = dev().download(g, 2);
  EXPECT_EQ(scales[0], kmath::fp8_scale_from_amax(want, 1.80f / 448.0f));
  EXPECT_EQ(scales[1], kmath::fp8_scale_from_amax(want_bf16, 1.80f / 448.0f));

  const float s = 0.0071f;
  std::vector<fp8> want_q(n), want_qb(n);
  cpu().fp8_encode_scaled(want_q.data(), x.data(), n, &s, kmath::Fp8::E4M3);
  cpu().fp8_encode_scaled(want_qb.data(), xb.data(), n, &s, kmath::Fp8::E4M3);
  float* gs = dev().upload(std::vector<float>{s});
  fp8* q = dev().alloc<fp8>(n);
  auto same_bytes = [&](const std::vector<fp8>& w) {
    const std::vector<fp8> got = dev().download(q, n);
    for (int64_t i = 0; i < n; ++i)
      if (got[i].bits != w[i].bits) return false;
    return true;
  };
  gpu().fp8_encode_scaled(q, dev().upload(x), n, gs, kmath::Fp8::E4M3);
  EXPECT_TRUE(same_bytes(want_q));
  gpu().fp8_encode_scaled(q, dev().upload(xb), n, gs, kmath::Fp8::E4M3);
  EXPECT_TRUE(same_bytes(want_qb));

  struct Shape {
    int64_t m, n, k;
  };
  const float sa = 0.0123f, sb = 1.12f / 448.0f;
  for (const char* mode : {"", "tf32"}) {
    setenv("ENGINE_CUDA_FP8_GEMM", mode, 1);
    for (Shape sh : {Shape{128, 64, 256}, Shape{33, 40, 72}}) {
      std::vector<fp8> a(sh.m * sh.k), b(sh.n * sh.k);
      cpu().fp8_encode(a.data(), random_vector(sh.m * sh.k, 32).data(), sh.m * sh.k, 0.01f,
                       kmath::Fp8::E4M3);
      cpu().fp8_encode(b.data(), random_vector(sh.n * sh.k, 33).data(), sh.n * sh.k, 0.01f,
                       kmath::Fp8::E4M3);
      GemmArgs args;
      args.trans_b = true, args.m = sh.m, args.n = sh.n, args.k = sh.k;
      args.fp8_fast_accum = true;
      std::vector<float> ref(sh.m * sh.n), bound(sh.m * sh.n);
      cpu().gemm_fp8_scaled(args, a.data(), kmath::Fp8::E4M3, &sa, b.data(), kmath::Fp8::E4M3, &sb,
                            ref.data());
      float* c = dev().alloc<float>(sh.m * sh.n);
      gpu().gemm_fp8_scaled(args, dev().upload(a), kmath::Fp8::E4M3,
                            dev().upload(std::vector<float>{sa}), dev().upload(b), kmath::Fp8::E4M3,
                            dev().upload(std::vector<float>{sb}), c);
      const std::vector<float> got = dev().download(c, sh.m * sh.n);
      std::vector<float> ma(a.size()), mb(b.size());
      for (size_t i = 0; i < a.size(); ++i)
        ma[i] = std::fabs(kmath::float_from_fp8(a[i], kmath::Fp8::E4M3));
      for (size_t i = 0; i < b.size(); ++i)
        mb[i] = std::fabs(kmath::float_from_fp8(b[i], kmath::Fp8::E4M3));
      GemmArgs abs_args = args;
      abs_args.alpha = sa * sb;
      cpu().gemm(abs_args, ma.data(), mb.data(), bound.data());
      const double tol = *mode == '\0' ? 1e-2 : 1e-5;
      double worst = 0;
      for (size_t i = 0; i < got.size(); ++i)
        worst = std::max(worst, std::fabs(double(got[i]) - ref[i]) / (double(bound[i]) + 1e-30));
      EXPECT_LE(worst, tol) << "m=" << sh.m << " ENGINE_CUDA_FP8_GEMM=" << mode;
    }
  }
  unsetenv("ENGINE_CUDA_FP8_GEMM");
}

// scalar_mix without b (model.v_lambdas_all in a block without a value table): out = wa a, and
// the backward leaves db and dwb alone.
TEST_F(CudaVsCpu, ScalarMixWithoutB) {
  const int64_t n = 1000;
  auto a = random_vector(n, 8), dout = random_vector(n, 9), da0 = random_vector(n, 10);
  const std::vector<float> w = {0.7f, -1.3f};
  std::vector<float> out(n), da = da0, dw = {0.25f, 0.5f};
  cpu().scalar_mix(out.data(), w.data(), a.data(), w.data() + 1, nullptr, n);
  cpu().scalar_mix_backward(da.data(), nullptr, dw.data(), dw.data() + 1, w.data(), a.data(),
                            w.data() + 1, nullptr, dout.data(), n);
  EXPECT_EQ(dw[1], 0.5f);
  float* gw = dev().upload(w);
  float* gout = dev().alloc<float>(n);
  float* ga = dev().upload(a);
  gpu().scalar_mix(gout, gw, ga, gw + 1, nullptr, n);
  EXPECT_CLOSE(dev().download(gout, n), out, 1e-6);
  float* gda = dev().upload(da0);
  float* gdw = dev().upload(std::vector<float>{0.25f, 0.5f});
  gpu().scalar_mix_backward(gda, nullptr, gdw, gdw + 1, gw, ga, gw + 1, nullptr, dev().upload(dout),
                            n);
  EXPECT_CLOSE(dev().download(gda, n), da, 1e-6);
  EXPECT_CLOSE(dev().download(gdw, 2), dw, 1e-4);
}

// Per-row coefficients at a stride (record #89's per-token gates), f32 and on bf16 streams.
TEST_F(CudaVsCpu, RowScaleAdd) {
  const int64_t rows = 37, cols = 300, K = 5;
  auto a = random_vector(rows * cols, 11), base = random_vector(rows * cols, 12),
       dout = random_vector(rows * cols, 13), c = random_vector(rows * K, 14),
       da0 = random_vector(rows * cols, 15), dc0 = random_vector(rows * K, 16);
  for (bool accumulate : {false, true}) {
    std::vector<float> out = base, da = da0, dc = dc0;
    cpu().row_scale_add(out.data(), c.data() + 2, K, a.data(), rows, cols, accumulate);
    cpu().row_scale_add_backward(da.data(), dc.data() + 2, c.data() + 2, K, a.data(), dout.data(),
                                 rows, cols);
    float* gout = dev().upload(base);
    float* gc = dev().upload(c);
    float* ga = dev().upload(a);
    gpu().row_scale_add(gout, gc + 2, K, ga, rows, cols, accumulate);
    EXPECT_CLOSE(dev().download(gout, out.size()), out, 1e-6);
    float* gda = dev().upload(da0);
    float* gdc = dev().upload(dc0);
    gpu().row_scale_add_backward(gda, gdc + 2, gc + 2, K, ga, dev().upload(dout), rows, cols);
    EXPECT_CLOSE(dev().download(gda, da.size()), da, 1e-6);
    EXPECT_CLOSE(dev().download(gdc, dc.size()), dc, 1e-4);
  }
  // bf16 stream: the same values rounded once.
  std::vector<bf16> a16(a.size()), out16(a.size());
  cpu().f32_to_bf16(a16.data(), a.data(), static_cast<int64_t>(a.size()));
  cpu().row_scale_add(out16.data(), c.data(), K, a16.data(), rows, cols, false);
  bf16* gout16 = dev().upload(std::vector<bf16>(a.size(), bf16{0}));
  float* gc = dev().upload(c);
  gpu().row_scale_add(gout16, gc, K, dev().upload(a16), rows, cols, false);
  const std::vector<bf16> got16 = dev().download(gout16, a.size());
  for (size_t i = 0; i < a.size(); ++i)
    ASSERT_EQ(got16[i].bits, out16[i].bits) << "element " << i;
}

// The scaled sigmoid and the sigmoid-scaled column (record #89's value-embedding and skip gates).
TEST_F(CudaVsCpu, SigmoidGates) {
  const int64_t n = 1537, K = 3;
  auto x = random_vector(n, 17), dout = random_vector(n, 18), d0 = random_vector(n, 19),
       c = random_vector(n * K, 20), dc0 = random_vector(n * K, 21);
  std::vector<float> out(n), din = d0;
  cpu().sigmoid_forward(out.data(), x.data(), 2.0f, n);
  cpu().sigmoid_backward(din.data(), x.data(), dout.data(), 2.0f, n);
  float* gout = dev().alloc<float>(n);
  float* gx = dev().upload(x);
  gpu().sigmoid_forward(gout, gx, 2.0f, n);
  EXPECT_CLOSE(dev().download(gout, n), out, 1e-6);
  float* gdin = dev().upload(d0);
  gpu().sigmoid_backward(gdin, gx, dev().upload(dout), 2.0f, n);
  EXPECT_CLOSE(dev().download(gdin, n), din, 1e-6);

  const std::vector<float> lambda = {-1.5f};
  std::vector<float> col(n), dc = dc0, dl = {0.25f};
  cpu().sigmoid_scale(col.data(), lambda.data(), c.data() + 1, K, n);
  cpu().sigmoid_scale_backward(dc.data() + 1, dl.data(), lambda.data(), c.data() + 1, K,
                               dout.data(), n);
  float* gl = dev().upload(lambda);
  float* gc = dev().upload(c);
  float* gcol = dev().alloc<float>(n);
  gpu().sigmoid_scale(gcol, gl, gc + 1, K, n);
  EXPECT_CLOSE(dev().download(gcol, n), col, 1e-6);
  float* gdc = dev().upload(dc0);
  float* gdl = dev().upload(std::vector<float>{0.25f});
  gpu().sigmoid_scale_backward(gdc + 1, gdl, gl, gc + 1, K, dev().upload(dout), n);
  EXPECT_CLOSE(dev().download(gdc, dc.size()), dc, 1e-6);
  EXPECT_CLOSE(dev().download(gdl, 1), dl, 1e-4);
}

// ||got - want|| / ||want||.
double norm_relative(const std::vector<float>& got, const std::vector<float>& want) {
  double d = 0.0, w = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    d += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    w += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(d / std::max(w, 1e-300));
}

// The fused kernels (tiles of 64, head dims padded to 32, 64 or 128) against the CPU's blocked
// attention: T of one element, below, across and not dividing a tile; head dims of the model
// (64, 128) and ones padded inside the kernels (4, 80). The backward writes over noise.
TEST_F(CudaVsCpu, Attention) {
  for (auto [BH, T, hd] : {std::tuple<int64_t, int64_t, int64_t>{3, 1, 64},
                           {6, 7, 4},
                           {4, 63, 64},
                           {2, 65, 128},
                           {3, 130, 64},
                           {2, 200, 128},
                           {2, 97, 80}}) {
    SCOPED_TRACE("BH " + std::to_string(BH) + " T " + std::to_string(T) + " hd " +
                 std::to_string(hd));
    const int64_t n = BH * T * hd;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    auto q = random_vector(n, 1, 2.0f), k = random_vector(n, 2, 2.0f), v = random_vector(n, 3);
    auto dout = random_vector(n, 4);
    auto dq0 = random_vector(n, 5), dk0 = random_vector(n, 6), dv0 = random_vector(n, 7);
    std::vector<float> out(n), lse(BH * T);
    cpu().attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), BH, T, hd, scale);
    float *gq = dev().upload(q), *gk = dev().upload(k), *gv = dev().upload(v);
    float *gout = dev().alloc<float>(n), *glse = dev().alloc<float>(BH * T);
    gpu().attention_forward(gout, glse, gq, gk, gv, BH, T, hd, scale);
    EXPECT_CLOSE(dev().download(gout, n), out, 1e-4);
    EXPECT_CLOSE(dev().download(glse, BH * T), lse, 1e-5);
    auto dq = dq0, dk = dk0, dv = dv0;
    cpu().attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                             q.data(), k.data(), v.data(), BH, T, hd, scale);
    float *gdq = dev().upload(dq0), *gdk = dev().upload(dk0), *gdv = dev().upload(dv0);
    float* gdout = dev().upload(dout);
    gpu().attention_backward(gdq, gdk, gdv, gdout, gout, glse, gq, gk, gv, BH, T, hd, scale);
    const auto got_dq = dev().download(gdq, n), got_dk = dev().download(gdk, n),
               got_dv = dev().download(gdv, n);
    EXPECT_CLOSE(got_dq, dq, 1e-4);
    EXPECT_CLOSE(got_dk, dk, 1e-4);
    EXPECT_CLOSE(got_dv, dv, 1e-4);
    // Each gradient element is summed in one place in a fixed order: run to run identical.
    float *gdq2 = dev().upload(dq0), *gdk2 = dev().upload(dk0), *gdv2 = dev().upload(dv0);
    gpu().attention_backward(gdq2, gdk2, gdv2, gdout, gout, glse, gq, gk, gv, BH, T, hd, scale);
    EXPECT_EQ(dev().download(gdq2, n), got_dq);
    EXPECT_EQ(dev().download(gdk2, n), got_dk);
    EXPECT_EQ(dev().download(gdv2, n), got_dv);
  }
}

// Document masks and sliding windows (core::AttentionMask) against the CPU's: 2 rows x 2 heads,
// T across three tiles, a window (100) that divides neither T nor a tile, documents that start
// inside a tile, a one-token document, and a document longer than the window; the kernels skip
// the key tiles before each query tile's first begin and stop a key tile's query scan early.
TEST_F(CudaVsCpu, AttentionWithDocumentAndWindowMask) {
  const int64_t B = 2, H = 2, BH = B * H, T = 150, hd = 64, n = BH * T * hd, window = 100;
  std::vector<int32_t> begin(B * T);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t doc = t >= 70 ? 70 : t >= 31 ? 31 : t >= 30 ? 30 : 0;  // [30, 31): one token
    begin[t] = static_cast<int32_t>(std::max(doc, t - window + 1));
    begin[T + t] = static_cast<int32_t>(std::max<int64_t>(0, t - window + 1));
  }
  const float scale = 0.12f;
  auto q = random_vector(n, 11, 2.0f), k = random_vector(n, 12, 2.0f), v = random_vector(n, 13);
  auto dout = random_vector(n, 14);
  std::vector<float> out(n), lse(BH * T);
  cpu().attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), BH, T, hd, scale,
                          {begin.data(), H});
  const int32_t* gbegin = dev().upload(begin);
  float *gq = dev().upload(q), *gk = dev().upload(k), *gv = dev().upload(v);
  float *gout = dev().alloc<float>(n), *glse = dev().alloc<float>(BH * T);
  gpu().attention_forward(gout, glse, gq, gk, gv, BH, T, hd, scale, {gbegin, H});
  EXPECT_CLOSE(dev().download(gout, n), out, 1e-4);
  EXPECT_CLOSE(dev().download(glse, BH * T), lse, 1e-5);
  std::vector<float> dq(n, 0.0f), dk(n, 0.0f), dv(n, 0.0f);
  cpu().attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                           q.data(), k.data(), v.data(), BH, T, hd, scale, {begin.data(), H});
  float *gdq = dev().upload(std::vector<float>(n, 0.0f)),
        *gdk = dev().upload(std::vector<float>(n, 0.0f)),
        *gdv = dev().upload(std::vector<float>(n, 0.0f));
  gpu().attention_backward(gdq, gdk, gdv, dev().upload(dout), gout, glse, gq, gk, gv, BH, T, hd,
                           scale, {gbegin, H});
  EXPECT_CLOSE(dev().download(gdq, n), dq, 1e-4);
  EXPECT_CLOSE(dev().download(gdk, n), dk, 1e-4);
  EXPECT_CLOSE(dev().download(gdv, n), dv, 1e-4);
}

// The model's layout (core::AttentionLayout): q, k, v read strided from one qkv [B, T, 3, H, hd],
// out [B, T, H hd], d q, k, v written into d qkv over noise, against the CPU in the same layout:
// the f32 flash kernels (hd 64 with 16-byte loads, 80 padded), the TF32 ones, and past hd 128
// the batched TF32 GEMMs with leading dimension 3 D (chunks within a batch row); masked and not.
TEST_F(CudaVsCpu, AttentionReadsQkvStridedAndWritesTokenRows) {
  using L = core::AttentionLayout;
  const int64_t B = 2, H = 3, BH = B * H, T = 130, N = B * T;
  std::vector<int32_t> begin(B * T);
  for (int64_t t = 0; t < T; ++t) {
    begin[t] = static_cast<int32_t>(t >= 70 ? 70 : t >= 31 ? 31 : t >= 30 ? 30 : 0);
    begin[T + t] = static_cast<int32_t>(std::max<int64_t>(0, t - 99));
  }
  const int32_t* gbegin = dev().upload(begin);
  for (auto [hd, tf32, masked] : {std::tuple<int64_t, bool, bool>{64, false, false},
                                  {64, false, true},
                                  {80, false, false},
                                  {64, true, true},
                                  {128, true, false},
                                  {160, true, true}}) {
    SCOPED_TRACE("hd " + std::to_string(hd) + (tf32 ? " tf32" : "") + (masked ? " masked" : ""));
    const int64_t D = H * hd;
    const core::HeadStrides in = L::token_rows(T, hd, 3 * D);
    const core::AttentionLayout layout{H, in, in, in, L::token_rows(T, hd, D)};
    const AttentionMask cmask = masked ? AttentionMask{begin.data(), H} : AttentionMask{};
    const AttentionMask gmask = masked ? AttentionMask{gbegin, H} : AttentionMask{};
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const auto qkv = random_vector(N * 3 * D, 41, 2.0f), dout = random_vector(N * D, 42);
    const auto noise = random_vector(N * 3 * D, 43);
    std::vector<float> out(N * D), lse(BH * T), dqkv = noise;
    const float* x = qkv.data();
    float* d = dqkv.data();
    cpu().attention_forward(out.data(), lse.data(), x, x + D, x + 2 * D, BH, T, hd, scale, cmask,
                            false, layout);
    cpu().attention_backward(d, d + D, d + 2 * D, dout.data(), out.data(), lse.data(), x, x + D,
                             x + 2 * D, BH, T, hd, scale, cmask, false, layout);
    const float* gx = dev().upload(qkv);
    float *gout = dev().alloc<float>(N * D), *glse = dev().alloc<float>(BH * T);
    float* gd = dev().upload(noise);
    gpu().attention_forward(gout, glse, gx, gx + D, gx + 2 * D, BH, T, hd, scale, gmask, tf32,
                            layout);
    gpu().attention_backward(gd, gd + D, gd + 2 * D, dev().upload(dout), gout, glse, gx, gx + D,
                             gx + 2 * D, BH, T, hd, scale, gmask, tf32, layout);
    const double tol = tf32 ? 5e-3 : 1e-5;
    EXPECT_LE(norm_relative(dev().download(gout, N * D), out), tol);
    EXPECT_LE(norm_relative(dev().download(glse, BH * T), lse), tol);
    EXPECT_LE(norm_relative(dev().download(gd, N * 3 * D), dqkv), tol);
  }
}

// Record #89's attention output corrections (XSA and the output gate) against the CPU's: alpha
// one row a token (stride H + 1), the gate one row for all (stride 0: its gradient summed by
// atomics on the device, in token order on the CPU), a value row below XSA's norm floor; the
// bf16 forward stores each value rounded once.
TEST_F(CudaVsCpu, AttentionOutputCorrections) {
  const int64_t B = 2, T = 33, H = 3, hd = 64, N = B * T, n = N * H * hd;
  const auto y = random_vector(n, 61), dout = random_vector(n, 62), dv0 = random_vector(n, 63);
  auto v = random_vector(n, 64);
  for (int64_t d = 0; d < hd; ++d)
    v[(1 * T + 1) * hd + d] = 1e-6f;  // batch row 0, head 1, position 1: |v|^2 < 1e-8
  const auto alpha = random_vector(N * (H + 1), 65), gate = random_vector(H, 66);
  std::vector<float> da(N * (H + 1), 0.0f), dg(H, 0.0f);
  const core::HeadCoefs ca{alpha.data(), da.data(), H + 1}, cg{gate.data(), dg.data(), 0};
  float *gda = dev().upload(da), *gdg = dev().upload(dg);
  const core::HeadCoefs ga{dev().upload(alpha), gda, H + 1}, gg{dev().upload(gate), gdg, 0};
  std::vector<float> out(n), dy(n), dv = dv0;
  cpu().attention_out_forward(out.data(), y.data(), v.data(), B, T, H, hd, ca, cg);
  cpu().attention_out_backward(dy.data(), dv.data(), dout.data(), y.data(), v.data(), B, T, H, hd,
                               ca, cg);
  const float *gy = dev().upload(y), *gv = dev().upload(v);
  float *gout = dev().alloc<float>(n), *gdy = dev().alloc<float>(n), *gdv = dev().upload(dv0);
  gpu().attention_out_forward(gout, gy, gv, B, T, H, hd, ga, gg);
  gpu().attention_out_backward(gdy, gdv, dev().upload(dout), gy, gv, B, T, H, hd, ga, gg);
  EXPECT_CLOSE(dev().download(gout, n), out, 1e-5);
  EXPECT_CLOSE(dev().download(gdy, n), dy, 1e-5);
  EXPECT_CLOSE(dev().download(gdv, n), dv, 1e-4);
  EXPECT_CLOSE(dev().download(gda, N * (H + 1)), da, 1e-4);
  EXPECT_CLOSE(dev().download(gdg, H), dg, 1e-4);
  std::vector<bf16> yb(n), outb(n);
  for (int64_t i = 0; i < n; ++i)
    yb[i] = kmath::bf16_from_float(y[i]);
  cpu().attention_out_forward(outb.data(), yb.data(), v.data(), B, T, H, hd, ca, cg);
  bf16* goutb = dev().alloc<bf16>(n);
  gpu().attention_out_forward(goutb, dev().upload(yb), gv, B, T, H, hd, ga, gg);
  const std::vector<bf16> got = dev().download(goutb, n);
  std::vector<float> got_f(n), want_f(n);
  for (int64_t i = 0; i < n; ++i) {
    got_f[i] = kmath::float_from_bf16(got[i]);
    want_f[i] = kmath::float_from_bf16(outb[i]);
  }
  EXPECT_CLOSE(got_f, want_f, 1e-2);  // a value near a bf16 tie may round the other way
}

// Record #89's paired heads (model/layers/rotary_attention.h): q, k, v and out token rows
// [B, T, H hd] viewed as [B, 2T, H / 2, hd] (row stride D / 2 < batch stride T D), B H / 2 heads
// of 2T with a [B, 2T] mask (documents doubled, a window on the interleaved sequence), against the
// CPU in the same view: the f32 flash kernels and the TF32 ones, masked and not.
TEST_F(CudaVsCpu, AttentionPairedHeadsView) {
  const int64_t B = 2, H = 6, T = 70, N = B * T, P = 2 * T, BH = B * H / 2;
  std::vector<int32_t> begin(B * P);
  for (int64_t p = 0; p < P; ++p) {
    begin[p] = static_cast<int32_t>(p >= 2 * 31 ? 2 * 31 : p >= 2 * 30 ? 2 * 30 : 0);
    begin[P + p] = static_cast<int32_t>(std::max<int64_t>(0, p - 99));
  }
  const int32_t* gbegin = dev().upload(begin);
  for (auto [hd, tf32, masked] : {std::tuple<int64_t, bool, bool>{64, false, false},
                                  {64, false, true},
                                  {64, true, true},
                                  {128, true, true}}) {
    SCOPED_TRACE("hd " + std::to_string(hd) + (tf32 ? " tf32" : "") + (masked ? " masked" : ""));
    const int64_t D = H * hd;
    const core::HeadStrides view{T * D, hd, D / 2};
    const core::AttentionLayout layout{H / 2, view, view, view, view};
    const AttentionMask cmask = masked ? AttentionMask{begin.data(), H / 2} : AttentionMask{};
    const AttentionMask gmask = masked ? AttentionMask{gbegin, H / 2} : AttentionMask{};
    const float scale = 0.12f;
    const auto q = random_vector(N * D, 51, 2.0f), k = random_vector(N * D, 52, 2.0f),
               v = random_vector(N * D, 53), dout = random_vector(N * D, 54);
    std::vector<float> out(N * D), lse(BH * P), dq(N * D), dk(N * D), dv(N * D);
    cpu().attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), BH, P, hd, scale,
                            cmask, false, layout);
    cpu().attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                             q.data(), k.data(), v.data(), BH, P, hd, scale, cmask, false, layout);
    const float *gq = dev().upload(q), *gk = dev().upload(k), *gv = dev().upload(v);
    float *gout = dev().alloc<float>(N * D), *glse = dev().alloc<float>(BH * P);
    float *gdq = dev().alloc<float>(N * D), *gdk = dev().alloc<float>(N * D),
          *gdv = dev().alloc<float>(N * D);
    gpu().attention_forward(gout, glse, gq, gk, gv, BH, P, hd, scale, gmask, tf32, layout);
    gpu().attention_backward(gdq, gdk, gdv, dev().upload(dout), gout, glse, gq, gk, gv, BH, P, hd,
                             scale, gmask, tf32, layout);
    const double tol = tf32 ? 5e-3 : 1e-5;
    EXPECT_LE(norm_relative(dev().download(gout, N * D), out), tol);
    EXPECT_LE(norm_relative(dev().download(glse, BH * P), lse), tol);
    EXPECT_LE(norm_relative(dev().download(gdq, N * D), dq), tol);
    EXPECT_LE(norm_relative(dev().download(gdk, N * D), dk), tol);
    EXPECT_LE(norm_relative(dev().download(gdv, N * D), dv), tol);
  }
}

// bf16 precision's attention (the bf16 out, the backward from it into a bf16 d qkv or f32
// d q, k, v) against the CPU's bf16 overloads in the model's layout, on every path: the FMA flash
// kernels (hd 64; 80 padded), the tensor-core ones (64, 128) on bf16 operands, the batched GEMMs
// past 128 (through f32 scratch, rounded after); each again on the tensor-core kernels' TF32
// operands (ENGINE_CUDA_ATTENTION_BF16_ON_TF32=1) and through the f32 kernels and rounding passes
// (ENGINE_CUDA_ATTENTION_BF16_VIA_F32=1), the earlier paths; masked and not. Both backwards read
// the CPU's bf16 out and lse, so only the kernels' arithmetic differs: a value near a bf16 tie
// may round the other way (2^-8 relative), so the bar is norm-relative, f32's 1e-5 plus bf16's
// flips (measured on the first GPU run; TF32 adds its own 2e-3, bf16 operands round q, k, v,
// dout and the probabilities to 8 bits as they enter a product, a bar of 2e-2 until a GPU run
// measures it: the test prints what it measures). The output's row stride is D + 5 in one case:
// the columns between the heads' rows are left as they were. Every element of d qkv is written
// (filled with NaNs first).
TEST_F(CudaVsCpu, Bf16AttentionMatchesTheCpu) {
  using L = core::AttentionLayout;
  const int64_t B = 2, H = 3, BH = B * H, T = 130, N = B * T;
  std::vector<int32_t> begin(B * T);
  for (int64_t t = 0; t < T; ++t) {
    begin[t] = static_cast<int32_t>(t >= 70 ? 70 : t >= 31 ? 31 : t >= 30 ? 30 : 0);
    begin[T + t] = static_cast<int32_t>(std::max<int64_t>(0, (t / 16 - 3) * 16));  // block window
  }
  const int32_t* gbegin = dev().upload(begin);
  auto widened = [](const std::vector<bf16>& x) {
    std::vector<float> out(x.size());
    for (size_t i = 0; i < x.size(); ++i)
      out[i] = kmath::float_from_bf16(x[i]);
    return out;
  };
  enum class Mode { kBf16Operands, kTf32Operands, kViaF32 };
  for (const Mode mode : {Mode::kBf16Operands, Mode::kTf32Operands, Mode::kViaF32}) {
    const bool via_f32 = mode == Mode::kViaF32;
    if (via_f32) {
      setenv("ENGINE_CUDA_ATTENTION_BF16_VIA_F32", "1", 1);
    } else {
      unsetenv("ENGINE_CUDA_ATTENTION_BF16_VIA_F32");
    }
    if (mode == Mode::kTf32Operands) {
      setenv("ENGINE_CUDA_ATTENTION_BF16_ON_TF32", "1", 1);
    } else {
      unsetenv("ENGINE_CUDA_ATTENTION_BF16_ON_TF32");
    }
    for (auto [hd, tf32, masked, gap] :
         {std::tuple<int64_t, bool, bool, int64_t>{64, false, false, 0},
          {64, false, true, 5},
          {80, false, false, 0},
          {64, true, true, 0},
          {128, true, false, 5},
          {160, true, true, 0}}) {
      const char* mode_name = mode == Mode::kBf16Operands   ? "bf16 operands"
                              : mode == Mode::kTf32Operands ? "tf32 operands"
                                                            : "via f32";
      SCOPED_TRACE("hd " + std::to_string(hd) + (tf32 ? " tf32" : "") + (masked ? " masked" : "") +
                   " " + mode_name + " gap " + std::to_string(gap));
      // The tensor-core flash kernels on bf16 operands: hd up to 128 with tf32 set.
      const bool bf16_operands = mode == Mode::kBf16Operands && tf32 && hd <= 128;
      const int64_t D = H * hd, ld = D + gap;
      const core::HeadStrides in = L::token_rows(T, hd, 3 * D);
      const core::AttentionLayout layout{H, in, in, in, L::token_rows(T, hd, ld)};
      const AttentionMask cmask = masked ? AttentionMask{begin.data(), H} : AttentionMask{};
      const AttentionMask gmask = masked ? AttentionMask{gbegin, H} : AttentionMask{};
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      const auto qkv = random_vector(N * 3 * D, 51, 2.0f), dout_f = random_vector(N * ld, 52);
      std::vector<bf16> out(N * ld, bf16{0x1234}), dqkv(N * 3 * D);
      std::vector<float> lse(BH * T), dq(N * D), dk(N * D), dv(N * D);
      const float* x = qkv.data();
      bf16* d = dqkv.data();
      cpu().attention_forward(out.data(), lse.data(), x, x + D, x + 2 * D, BH, T, hd, scale, cmask,
                              false, layout);
      cpu().attention_backward(d, d + D, d + 2 * D, dout_f.data(), out.data(), lse.data(), x, x + D,
                               x + 2 * D, BH, T, hd, scale, cmask, false, layout);
      // The f32 gradients (the modern blocks' overload) as packed heads: read q, k, v packed too.
      const core::AttentionLayout packed_in{H, L::packed_heads(H, T, hd), L::packed_heads(H, T, hd),
                                            L::packed_heads(H, T, hd), layout.out};
      std::vector<float> q(N * D), k(N * D), v(N * D);
      cpu().split_heads(q.data(), k.data(), v.data(), x, B, T, H, hd);
      cpu().attention_backward(dq.data(), dk.data(), dv.data(), dout_f.data(), out.data(),
                               lse.data(), q.data(), k.data(), v.data(), BH, T, hd, scale, cmask,
                               false, packed_in);

      const float* gx = dev().upload(qkv);
      const float* gdout = dev().upload(dout_f);
      bf16* gout = dev().upload(std::vector<bf16>(N * ld, bf16{0x1234}));
      float* glse = dev().alloc<float>(BH * T);
      gpu().attention_forward(gout, glse, gx, gx + D, gx + 2 * D, BH, T, hd, scale, gmask, tf32,
                              layout);
      const std::vector<bf16> got_out = dev().download(gout, N * ld);
      const double tol = bf16_operands ? 2e-2 : tf32 ? 6e-3 : 2e-3;
      const double out_error = norm_relative(widened(got_out), widened(out));
      EXPECT_LE(out_error, tol);
      EXPECT_LE(norm_relative(dev().download(glse, BH * T), lse), tf32 ? 5e-3 : 1e-5);
      for (int64_t r = 0; r < N; ++r)
        for (int64_t c = D; c < ld; ++c)
          ASSERT_EQ(got_out[r * ld + c].bits, 0x1234) << "a gap column was written: " << r;
      // The backwards from the CPU's out and lse.
      const bf16* cout_b = dev().upload(out);
      const float* clse = dev().upload(lse);
      bf16* gd = dev().upload(std::vector<bf16>(N * 3 * D, bf16{0x7FC1}));
      gpu().attention_backward(gd, gd + D, gd + 2 * D, gdout, cout_b, clse, gx, gx + D, gx + 2 * D,
                               BH, T, hd, scale, gmask, tf32, layout);
      const double dqkv_error =
          norm_relative(widened(dev().download(gd, N * 3 * D)), widened(dqkv));
      EXPECT_LE(dqkv_error, tol);
      // Over NaNs too: the f32 d q, k, v are written (=) in every element.
      const std::vector<float> nans(N * D, std::nanf(""));
      float *gdq = dev().upload(nans), *gdk = dev().upload(nans), *gdv = dev().upload(nans);
      gpu().attention_backward(gdq, gdk, gdv, gdout, cout_b, clse, dev().upload(q), dev().upload(k),
                               dev().upload(v), BH, T, hd, scale, gmask, tf32, packed_in);
      const double ftol = bf16_operands ? 2e-2 : tf32 ? 5e-3 : 1e-5;
      const double dq_error = norm_relative(dev().download(gdq, N * D), dq),
                   dk_error = norm_relative(dev().download(gdk, N * D), dk),
                   dv_error = norm_relative(dev().download(gdv, N * D), dv);
      EXPECT_LE(dq_error, ftol);
      EXPECT_LE(dk_error, ftol);
      EXPECT_LE(dv_error, ftol);
      if (bf16_operands)
        std::printf(
            "[ measured ] bf16-operand attention hd %lld%s: out %.3g, d qkv %.3g, "
            "dq %.3g, dk %.3g, dv %.3g\n",
            static_cast<long long>(hd), masked ? " masked" : "", out_error, dqkv_error, dq_error,
            dk_error, dv_error);
    }
  }
  unsetenv("ENGINE_CUDA_ATTENTION_BF16_VIA_F32");
  unsetenv("ENGINE_CUDA_ATTENTION_BF16_ON_TF32");
}

// The row steps of attention as GEMMs (core/attention_by_gemm.h) against the CPU's: heads from
// head0 = 2 under a document and window mask, a row length that is no multiple of a warp.
TEST_F(CudaVsCpu, AttentionSoftmaxRows) {
  const int64_t H = 2, BH = 4, T = 45, hd = 40, head0 = 2;
  std::vector<int32_t> begin(3 * T);
  for (int64_t t = 0; t < T; ++t) {
    begin[t] = 0;
    begin[T + t] = static_cast<int32_t>(t >= 20 ? 20 : t >= 5 ? 5 : 0);
    begin[2 * T + t] = static_cast<int32_t>(std::max<int64_t>(0, t - 16));
  }
  const AttentionMask cmask{begin.data(), H}, gmask{dev().upload(begin), H};
  auto s = random_vector(BH * T * T, 21, 3.0f);
  std::vector<float> lse(BH * T);
  float *gs = dev().upload(s), *glse = dev().alloc<float>(BH * T);
  cpu().attention_softmax(s.data(), lse.data(), BH, T, cmask, head0);
  gpu().attention_softmax(gs, glse, BH, T, gmask, head0);
  EXPECT_CLOSE(dev().download(gs, BH * T * T), s, 1e-6);
  EXPECT_CLOSE(dev().download(glse, BH * T), lse, 1e-6);
  auto dp = random_vector(BH * T * T, 22), dout = random_vector(BH * T * hd, 23),
       out = random_vector(BH * T * hd, 24);
  float* gdp = dev().upload(dp);
  cpu().attention_softmax_backward(dp.data(), s.data(), dout.data(), out.data(), BH, T, hd, cmask,
                                   head0);
  gpu().attention_softmax_backward(gdp, gs, dev().upload(dout), dev().upload(out), BH, T, hd, gmask,
                                   head0);
  EXPECT_CLOSE(dev().download(gdp, BH * T * T), dp, 1e-5);
}

// With tf32 the CUDA backend computes attention on TF32 tensor cores (the flash kernels of
// attention_mma.cu, whose fragment maps MmaFragments.* checks on the host; past head dim 128
// batched TF32 GEMMs, core/attention_by_gemm.h, whose composition AttentionByGemm.* checks):
// against the CPU's f32 attention within TF32's rounding (inputs to 10 mantissa bits: below 2e-3
// norm-relative is the expectation), with and without a mask, and the same bits run to run.
TEST_F(CudaVsCpu, AttentionOnTf32TensorCores) {
  const int64_t B = 2, H = 2, T = 150;
  std::vector<int32_t> begin(B * T);
  for (int64_t t = 0; t < T; ++t) {
    begin[t] = static_cast<int32_t>(t >= 70 ? 70 : t >= 31 ? 31 : t >= 30 ? 30 : 0);
    begin[T + t] = static_cast<int32_t>(std::max<int64_t>(0, t - 99));
  }
  const int32_t* gbegin = dev().upload(begin);
  // Head dims up to 128 take the flash kernels on TF32 tensor cores (padded to 32, 64 or 128),
  // 160 the batched TF32 GEMMs (core/attention_by_gemm.h); T from one row to partial tiles.
  for (auto [BH, T_, hd, masked] : {std::tuple<int64_t, int64_t, int64_t, bool>{3, 1, 64, false},
                                    {6, 7, 4, false},
                                    {2, 97, 80, false},
                                    {3, 130, 64, false},
                                    {2, 200, 128, false},
                                    {B * H, T, 64, true},
                                    {B * H, T, 128, true},
                                    {2, 70, 160, false},
                                    {B * H, T, 160, true}}) {
    SCOPED_TRACE("BH " + std::to_string(BH) + " T " + std::to_string(T_) + " hd " +
                 std::to_string(hd) + (masked ? " masked" : ""));
    const int64_t n = BH * T_ * hd;
    const AttentionMask cmask = masked ? AttentionMask{begin.data(), H} : AttentionMask{};
    const AttentionMask gmask = masked ? AttentionMask{gbegin, H} : AttentionMask{};
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    auto q = random_vector(n, 31, 2.0f), k = random_vector(n, 32, 2.0f), v = random_vector(n, 33);
    auto dout = random_vector(n, 34);
    std::vector<float> out(n), lse(BH * T_), dq(n, 0.0f), dk(n, 0.0f), dv(n, 0.0f);
    cpu().attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), BH, T_, hd, scale,
                            cmask);
    cpu().attention_backward(dq.data(), dk.data(), dv.data(), dout.data(), out.data(), lse.data(),
                             q.data(), k.data(), v.data(), BH, T_, hd, scale, cmask);
    float *gq = dev().upload(q), *gk = dev().upload(k), *gv = dev().upload(v);
    float *gout = dev().alloc<float>(n), *glse = dev().alloc<float>(BH * T_);
    gpu().attention_forward(gout, glse, gq, gk, gv, BH, T_, hd, scale, gmask, true);
    EXPECT_LE(norm_relative(dev().download(gout, n), out), 5e-3);
    EXPECT_LE(norm_relative(dev().download(glse, BH * T_), lse), 5e-3);
    std::vector<std::vector<float>> grads[2];
    for (auto& got : grads) {
      float *gdq = dev().upload(std::vector<float>(n, 0.0f)),
            *gdk = dev().upload(std::vector<float>(n, 0.0f)),
            *gdv = dev().upload(std::vector<float>(n, 0.0f));
      gpu().attention_backward(gdq, gdk, gdv, dev().upload(dout), gout, glse, gq, gk, gv, BH, T_,
                               hd, scale, gmask, true);
      got = {dev().download(gdq, n), dev().download(gdk, n), dev().download(gdv, n)};
    }
    EXPECT_LE(norm_relative(grads[0][0], dq), 5e-3);
    EXPECT_LE(norm_relative(grads[0][1], dk), 5e-3);
    EXPECT_LE(norm_relative(grads[0][2], dv), 5e-3);
    EXPECT_EQ(grads[0], grads[1]) << "two runs of the TF32 backward differ";
  }
}

#ifdef ENGINE_HAVE_CUDA
// The rule alone (no device): the cross-entropy on bf16 logits keeps a row in shared memory where
// its V bf16 logits (in 16-byte packs) and the reduction's 32 states fit the block's opt-in limit:
// GPT-2's 50257 columns on an H100 (227 KB) and on sm_86/89 (99 KB), not in the default 48 KB,
// nor a row of 150000.
TEST(ClassifierPath, KeepsTheRowInSharedMemoryWhereItFits) {
  using cuda_detail::classifier_row_smem;
  if (cuda_detail::classifier_two_pass_forced()) GTEST_SKIP() << "two passes forced";
  EXPECT_EQ(classifier_row_smem(50257, 232448), 100528u);
  EXPECT_EQ(classifier_row_smem(50257, 101376), 100528u);
  EXPECT_EQ(classifier_row_smem(50257, 49152), 0u);
  EXPECT_EQ(classifier_row_smem(150000, 232448), 0u);
  EXPECT_EQ(classifier_row_smem(7, 49152), 16u);
  EXPECT_EQ(classifier_row_smem(24448, 49152), 48896u);  // 48896 + 256 = 49152
  EXPECT_EQ(classifier_row_smem(24449, 49152), 0u);      // 48912 + 256 > 49152
}
#endif

#ifdef ENGINE_HAVE_CUDA
// The dispatch rule alone (no device): which kernels an attention takes on an H100 (227 KB of
// shared memory a block), on sm_86/89 GPUs (99 KB) and before sm_80.
TEST(AttentionPath, TakesTheKernelsThatFitTheDevice) {
  using cuda_detail::attention_path;
  using P = cuda_detail::AttentionPath;
  const cuda_detail::AttentionDevice h100{90, 232448}, sm86{86, 101376}, t4{75, 65536};
  EXPECT_EQ(attention_path(true, 64, 1024, h100), P::kFlashTf32);
  EXPECT_EQ(attention_path(true, 128, 1024, h100), P::kFlashTf32);
  EXPECT_EQ(attention_path(true, 160, 1024, h100), P::kByGemmTf32);  // past the tiles
  EXPECT_EQ(attention_path(false, 128, 1024, h100), P::kFlash);
  // sm_86: the TF32 backward at head dim 128 (135,680 bytes) and the FMA one (149,248) do not fit.
  EXPECT_GT(cuda_detail::flash_mma_smem(128), sm86.max_smem_per_block);
  EXPECT_GT(cuda_detail::flash_smem(128), sm86.max_smem_per_block);
  EXPECT_EQ(attention_path(true, 64, 1024, sm86), P::kFlashTf32);
  EXPECT_EQ(attention_path(true, 128, 1024, sm86), P::kByGemmTf32);
  EXPECT_EQ(attention_path(false, 64, 1024, sm86), P::kFlash);
  EXPECT_EQ(attention_path(false, 128, 1024, sm86), P::kByGemm);
  EXPECT_EQ(attention_path(false, 128, 8192, sm86), P::kFlash);  // scores past the scratch
  // Before sm_80 no TF32 tensor cores: the GEMMs (cuBLAS runs them in f32). A T4's 64 KB holds
  // no FMA flash tiles of head dim 64 (83,712 bytes) either.
  EXPECT_EQ(attention_path(true, 64, 1024, t4), P::kByGemmTf32);
  EXPECT_EQ(attention_path(false, 64, 1024, t4), P::kByGemm);
  EXPECT_EQ(attention_path(false, 32, 1024, t4), P::kFlash);
  // Head dims the flash kernels refuse stay with them (they name the head dim).
  EXPECT_EQ(attention_path(false, 200, 1024, h100), P::kFlash);
  EXPECT_EQ(attention_path(true, 64, 8192, t4), P::kFlash);
}
#endif

TEST_F(CudaVsCpu, AttentionRefusesAHeadDimAboveTheKernels) {
  const int64_t BH = 1, T = 2, hd = 130;
  float* x = dev().alloc<float>(BH * T * hd);
  float* lse = dev().alloc<float>(BH * T);
  try {
    gpu().attention_forward(x, lse, x, x, x, BH, T, hd, 1.0f);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("head dimension 130"), std::string::npos) << e.what();
  }
}

// ---- loss ---------------------------------------------------------------------------------------

TEST_F(CudaVsCpu, CrossEntropyWithPaddingAndSoftcap) {
  const int64_t N = 9, V = 50, Vp = 64;
  auto logits = random_vector(N * Vp, 1, 3.0f);
  auto targets = random_ids(N, V, 2);
  for (float cap : {0.0f, 15.0f}) {
    std::vector<float> losses(N), dlogits(N * Vp);
    cpu().cross_entropy(losses.data(), dlogits.data(), logits.data(), targets.data(), N, V, Vp, cap,
                        1.0f / N);
    float* gl = dev().alloc<float>(N);
    float* gz = dev().upload(logits);
    float* gd = dev().alloc<float>(N * Vp);
    int32_t* gt = dev().upload(targets);
    gpu().cross_entropy(gl, gd, gz, gt, N, V, Vp, cap, 1.0f / N);
    EXPECT_CLOSE(dev().download(gl, N), losses, 1e-5);
    EXPECT_CLOSE(dev().download(gd, N * Vp), dlogits, 1e-6);
    // dlogits may alias logits; losses alone when dlogits is null.
    gpu().cross_entropy(gl, gz, gz, gt, N, V, Vp, cap, 1.0f / N);
    EXPECT_CLOSE(dev().download(gl, N), losses, 1e-5);
    EXPECT_CLOSE(dev().download(gz, N * Vp), dlogits, 1e-6);
    float* gz2 = dev().upload(logits);
    gpu().cross_entropy(gl, nullptr, gz2, gt, N, V, Vp, cap, 1.0f / N);
    EXPECT_CLOSE(dev().download(gl, N), losses, 1e-5);
  }
}

// Record #89's training loss (kmath::LossTerms: three offsets and the prefix target, rows of 7,
// targets that repeat so that terms share a column) on f32 logits and on bf16 logits (the
// one-read kernel at GPT-2's width, the two-pass kernel when forced by width), against the CPU.
TEST_F(CudaVsCpu, CrossEntropyMultiTokenAndPrefixTerms) {
  struct Case {
    int64_t N, T, V, Vp;
    float cap;
  };
  for (const Case& k : {Case{14, 7, 50, 64, 0.0f}, Case{21, 7, 300, 320, 15.0f},
                        Case{6, 3, 50257, 50304, 15.0f}, Case{4, 2, 150000, 150016, 0.0f}}) {
    std::vector<int32_t> targets = random_ids(k.N, static_cast<int32_t>(k.V), 6);
    for (int64_t n = 1; n < k.N; n += 3)
      targets[n] = targets[n - 1];
    std::vector<int32_t> prefix_of(k.V);
    for (int64_t v = 0; v < k.V; ++v)
      prefix_of[v] = v % 4 == 0 ? -1 : static_cast<int32_t>((v * 13) % k.V);
    kmath::LossTerms terms;
    terms.offsets = 3;
    terms.weight[0] = 1.0f, terms.weight[1] = 0.5f, terms.weight[2] = 0.125f;
    terms.row_tokens = k.T;
    terms.prefix_weight = 0.25f;
    kmath::LossTerms gpu_terms = terms;
    terms.prefix_of = prefix_of.data();
    gpu_terms.prefix_of = dev().upload(prefix_of);
    const int64_t n = k.N * k.Vp;
    const std::string what = "V " + std::to_string(k.V);
    int32_t* gt = dev().upload(targets);
    float* gl = dev().alloc<float>(k.N);
    // f32 logits
    auto logits = random_vector(n, 7, 3.0f);
    std::vector<float> loss(k.N), want(n);
    cpu().cross_entropy(loss.data(), want.data(), logits.data(), targets.data(), k.N, k.V, k.Vp,
                        k.cap, 1.0f / k.N, terms);
    float* gz = dev().upload(logits);
    gpu().cross_entropy(gl, gz, gz, gt, k.N, k.V, k.Vp, k.cap, 1.0f / k.N, gpu_terms);  // in place
    EXPECT_CLOSE(dev().download(gl, k.N), loss, 1e-5) << what;
    EXPECT_CLOSE(dev().download(gz, n), want, 1e-6) << what;
    // bf16 logits: within one bf16 unit of the CPU's
    std::vector<bf16> lb(n);
    for (int64_t i = 0; i < n; ++i)
      lb[i] = kmath::bf16_from_float(logits[i]);
    std::vector<bf16> wb(n);
    cpu().cross_entropy(loss.data(), wb.data(), lb.data(), targets.data(), k.N, k.V, k.Vp, k.cap,
                        1.0f / k.N, terms);
    bf16* gb = dev().upload(lb);
    gpu().cross_entropy(gl, gb, gb, gt, k.N, k.V, k.Vp, k.cap, 1.0f / k.N, gpu_terms);
    EXPECT_CLOSE(dev().download(gl, k.N), loss, 1e-5) << what;
    const std::vector<bf16> got = dev().download(gb, n);
    for (int64_t i = 0; i < n; ++i) {
      const float g = kmath::float_from_bf16(got[i]), w = kmath::float_from_bf16(wb[i]);
      ASSERT_LE(std::fabs(g - w), 0x1p-7f * std::fabs(w) + 0x1p-133f) << what << " at " << i;
    }
  }
}

TEST_F(CudaVsCpu, CrossEntropyRejectsATargetOutOfRange) {
  const int64_t N = 4, V = 10, Vp = 16;
  std::vector<int32_t> targets = {1, 2, 10, 3};  // row 2 is out of [0, V)
  float* gl = dev().alloc<float>(N);
  gpu().cross_entropy(gl, nullptr, dev().upload(random_vector(N * Vp, 1)), dev().upload(targets), N,
                      V, Vp, 0.0f, 1.0f);
  try {
    gpu().synchronize();
    FAIL() << "an out-of-range target was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 2"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(gpu().synchronize());  // reported once, then cleared
}

TEST_F(CudaVsCpu, NegativeIdsAreReported) {
  const int64_t B = 1, T = 4, D = 8;
  std::vector<int32_t> tokens = {0, 1, -3, 2};
  float* out = dev().alloc<float>(B * T * D);
  gpu().embedding_forward(out, dev().upload(tokens), dev().upload(random_vector(3 * D, 1)), nullptr,
                          B, T, D);
  try {
    gpu().synchronize();
    FAIL() << "a negative token id was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("position 2"), std::string::npos) << e.what();
  }
  std::vector<int32_t> index = {1, -1};
  gpu().gather_rows(out, dev().upload(random_vector(2 * D, 2)), dev().upload(index), nullptr, 2, D);
  EXPECT_THROW(gpu().synchronize(), Error);
  // combine_rows names the position in slot_row, as the CPU does (token 1's second slot).
  const std::vector<int32_t> slot_row = {0, 3, 2, -1};
  bf16* base = dev().upload(std::vector<bf16>(2 * D));
  gpu().combine_rows(base, base, dev().upload(random_vector(4 * D, 3)), dev().upload(slot_row),
                     dev().upload(random_vector(4, 4)), 2, 2, D);
  try {
    gpu().synchronize();
    FAIL() << "a negative dispatch row was not reported";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("combine_rows"), std::string::npos) << what;
    EXPECT_NE(what.find("position 3"), std::string::npos) << what;
  }
}

TEST_F(CudaVsCpu, LinearAlgebraRejectsNonFiniteInput) {
  const int64_t n = 5;
  auto a = random_vector(2 * n * n, 1);
  a[n * n + 3] = std::nanf("");  // batch member 1
  float* ga = dev().upload(a);
  float *x = dev().alloc<float>(2 * n * n), *y = dev().alloc<float>(2 * n * n);
  float* s = dev().alloc<float>(2 * n);
  try {
    gpu().svd(x, s, y, ga, n, n, 2);
    FAIL() << "svd accepted a NaN";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("svd"), std::string::npos) << what;
    EXPECT_NE(what.find("batch member 1"), std::string::npos) << what;
  }
  EXPECT_THROW(gpu().qr(x, y, ga, n, n, 2), Error);
}

// ---- rows ---------------------------------------------------------------------------------------

TEST_F(CudaVsCpu, GatherScatterRowDot) {
  const int64_t rows = 6, n = 11, D = 13;
  auto src = random_vector(rows * D, 1);
  auto index = random_ids(n, rows, 2);
  auto weight = random_vector(n, 3);
  float *gsrc = dev().upload(src), *gw = dev().upload(weight);
  int32_t* gi = dev().upload(index);
  for (bool weighted : {false, true}) {
    std::vector<float> out(n * D);
    cpu().gather_rows(out.data(), src.data(), index.data(), weighted ? weight.data() : nullptr, n,
                      D);
    float* gout = dev().alloc<float>(n * D);
    gpu().gather_rows(gout, gsrc, gi, weighted ? gw : nullptr, n, D);
    EXPECT_CLOSE(dev().download(gout, n * D), out, 1e-6);
    auto dst0 = random_vector(rows * D, 4);
    auto dst = dst0;
    cpu().scatter_add_rows(dst.data(), out.data(), index.data(), weighted ? weight.data() : nullptr,
                           n, D);
    float* gdst = dev().upload(dst0);
    gpu().scatter_add_rows(gdst, gout, gi, weighted ? gw : nullptr, n, D);
    EXPECT_CLOSE(dev().download(gdst, rows * D), dst, 1e-5);
  }
  auto a = random_vector(n * D, 5), b = random_vector(n * D, 6);
  std::vector<float> dots(n);
  cpu().row_dot(dots.data(), a.data(), b.data(), n, D);
  float* gdots = dev().alloc<float>(n);
  gpu().row_dot(gdots, dev().upload(a), dev().upload(b), n, D);
  EXPECT_CLOSE(dev().download(gdots, n), dots, 1e-5);
}

// ---- linear algebra, by identities --------------------------------------------------------------

// Row-major product of x [m, k] and y [k, n] in float64, optionally transposing either.
std::vector<double> matmul(const float* x, const float* y, int64_t m, int64_t n, int64_t k,
                           bool tx = false, bool ty = false) {
  std::vector<double> out(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (int64_t l = 0; l < k; ++l) {
        double xv = tx ? x[l * m + i] : x[i * k + l];
        double yv = ty ? y[j * k + l] : y[l * n + j];
        s += xv * yv;
      }
      out[i * n + j] = s;
    }
  }
  return out;
}

double max_abs_diff(const std::vector<double>& x, const float* y) {
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    double d = std::abs(x[i] - y[i]);
    if (!(d <= worst)) worst = d;
  }
  return worst;
}

std::vector<float> identity(int64_t n) {
  std::vector<float> eye(n * n, 0.0f);
  for (int64_t i = 0; i < n; ++i)
    eye[i * n + i] = 1.0f;
  return eye;
}

TEST_F(CudaVsCpu, QrIdentities) {
  for (auto [m, n, batch] :
       {std::tuple<int64_t, int64_t, int64_t>{9, 5, 1}, {5, 9, 1}, {40, 40, 1}, {12, 7, 3}}) {
    const int64_t r = std::min(m, n);
    auto a = random_vector(batch * m * n, 1);
    float *gq = dev().alloc<float>(batch * m * r), *gr = dev().alloc<float>(batch * r * n);
    gpu().qr(gq, gr, dev().upload(a), m, n, batch);
    auto q = dev().download(gq, batch * m * r), rr = dev().download(gr, batch * r * n);
    // geqrf + orgqr on both sides: the same Householder signs, so the factors agree too.
    std::vector<float> q_cpu(q.size()), r_cpu(rr.size());
    cpu().qr(q_cpu.data(), r_cpu.data(), a.data(), m, n, batch);
    EXPECT_CLOSE(q, q_cpu, 1e-3);
    EXPECT_CLOSE(rr, r_cpu, 1e-3);
    for (int64_t b = 0; b < batch; ++b) {
      const float* qb = q.data() + b * m * r;
      const float* rb = rr.data() + b * r * n;
      EXPECT_LE(max_abs_diff(matmul(qb, rb, m, n, r), a.data() + b * m * n), 1e-4)
          << "A = QR, m=" << m << " n=" << n << " b=" << b;
      EXPECT_LE(max_abs_diff(matmul(qb, qb, r, r, m, true), identity(r).data()), 1e-5)
          << "Q^T Q = I, m=" << m << " n=" << n << " b=" << b;
      for (int64_t i = 0; i < r; ++i) {
        for (int64_t j = 0; j < std::min(i, n); ++j)
          EXPECT_EQ(rb[i * n + j], 0.0f);
      }
    }
  }
}

TEST_F(CudaVsCpu, EighIdentities) {
  // n <= 32 with batch > 1 takes the batched Jacobi path, the others syevd.
  for (auto [n, batch] : {std::pair<int64_t, int64_t>{7, 1}, {16, 4}, {48, 2}}) {
    auto x = random_vector(batch * n * n, 1);
    std::vector<float> a(batch * n * n);
    for (int64_t b = 0; b < batch; ++b) {  // symmetric: (X + X^T) / 2
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          a[b * n * n + i * n + j] = 0.5f * (x[b * n * n + i * n + j] + x[b * n * n + j * n + i]);
        }
      }
    }
    float *gw = dev().alloc<float>(batch * n), *gv = dev().alloc<float>(batch * n * n);
    gpu().eigh(gw, gv, dev().upload(a), n, batch);
    auto w = dev().download(gw, batch * n), v = dev().download(gv, batch * n * n);
    std::vector<float> w_cpu(w.size()), v_cpu(v.size());
    cpu().eigh(w_cpu.data(), v_cpu.data(), a.data(), n, batch);
    EXPECT_CLOSE(w, w_cpu, 1e-4);
    for (int64_t b = 0; b < batch; ++b) {
      const float* vb = v.data() + b * n * n;
      const float* wb = w.data() + b * n;
      EXPECT_TRUE(std::is_sorted(wb, wb + n)) << "eigenvalues ascending, n=" << n;
      auto av = matmul(a.data() + b * n * n, vb, n, n, n);
      std::vector<float> vw(n * n);
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < n; ++j)
          vw[i * n + j] = vb[i * n + j] * wb[j];
      }
      EXPECT_LE(max_abs_diff(av, vw.data()), 1e-4) << "A V = V diag(w), n=" << n;
      EXPECT_LE(max_abs_diff(matmul(vb, vb, n, n, n, true), identity(n).data()), 1e-5)
          << "V^T V = I, n=" << n;
    }
  }
}

TEST_F(CudaVsCpu, SvdIdentities) {
  // Batched Jacobi for small matrices with batch > 1, gesvdj otherwise; tall and wide.
  for (auto [m, n, batch] :
       {std::tuple<int64_t, int64_t, int64_t>{9, 5, 1}, {5, 9, 1}, {12, 20, 3}, {40, 33, 2}}) {
    const int64_t r = std::min(m, n);
    auto a = random_vector(batch * m * n, 1);
    float *gu = dev().alloc<float>(batch * m * r), *gs = dev().alloc<float>(batch * r),
          *gvt = dev().alloc<float>(batch * r * n);
    gpu().svd(gu, gs, gvt, dev().upload(a), m, n, batch);
    auto u = dev().download(gu, batch * m * r), s = dev().download(gs, batch * r),
         vt = dev().download(gvt, batch * r * n);
    std::vector<float> u_cpu(u.size()), s_cpu(s.size()), vt_cpu(vt.size());
    cpu().svd(u_cpu.data(), s_cpu.data(), vt_cpu.data(), a.data(), m, n, batch);
    EXPECT_CLOSE(s, s_cpu, 1e-4);
    for (int64_t b = 0; b < batch; ++b) {
      const float* ub = u.data() + b * m * r;
      const float* sb = s.data() + b * r;
      const float* vtb = vt.data() + b * r * n;
      EXPECT_TRUE(std::is_sorted(sb, sb + r, std::greater<float>())) << "descending";
      std::vector<float> us(m * r);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < r; ++j)
          us[i * r + j] = ub[i * r + j] * sb[j];
      }
      EXPECT_LE(max_abs_diff(matmul(us.data(), vtb, m, n, r), a.data() + b * m * n), 1e-4)
          << "A = U S V^T, m=" << m << " n=" << n;
      EXPECT_LE(max_abs_diff(matmul(ub, ub, r, r, m, true), identity(r).data()), 1e-5)
          << "U^T U = I, m=" << m << " n=" << n;
      EXPECT_LE(max_abs_diff(matmul(vtb, vtb, r, r, n, false, true), identity(r).data()), 1e-5)
          << "V^T V = I, m=" << m << " n=" << n;
    }
  }
}

// The 10 x 10 Hilbert matrix (condition number ~1e13, beyond float): the factorizations are
// backward stable, so their identities must still hold to float precision.
TEST_F(CudaVsCpu, IllConditionedIdentities) {
  const int64_t n = 10;
  std::vector<float> h(n * n);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j)
      h[i * n + j] = 1.0f / static_cast<float>(i + j + 1);
  }
  float* gh = dev().upload(h);
  float *x = dev().alloc<float>(n * n), *y = dev().alloc<float>(n * n), *s = dev().alloc<float>(n);
  gpu().qr(x, y, gh, n, n);
  auto q = dev().download(x, n * n), r = dev().download(y, n * n);
  EXPECT_LE(max_abs_diff(matmul(q.data(), r.data(), n, n, n), h.data()), 1e-5);
  EXPECT_LE(max_abs_diff(matmul(q.data(), q.data(), n, n, n, true), identity(n).data()), 1e-5);
  gpu().eigh(s, x, gh, n);
  auto w = dev().download(s, n), v = dev().download(x, n * n);
  std::vector<float> vw(n * n);
  for (int64_t i = 0; i < n * n; ++i)
    vw[i] = v[i] * w[i % n];
  EXPECT_LE(max_abs_diff(matmul(h.data(), v.data(), n, n, n), vw.data()), 1e-5);
  EXPECT_LE(max_abs_diff(matmul(v.data(), v.data(), n, n, n, true), identity(n).data()), 1e-5);
  float* vt = dev().alloc<float>(n * n);
  gpu().svd(x, s, vt, gh, n, n);
  auto u = dev().download(x, n * n), sv = dev().download(s, n), vtv = dev().download(vt, n * n);
  std::vector<float> us(n * n);
  for (int64_t i = 0; i < n * n; ++i)
    us[i] = u[i] * sv[i % n];
  // Only the reconstruction: singular vectors of values at the float noise level are not
  // determined, and a Jacobi SVD does not promise orthogonal U columns for them.
  EXPECT_LE(max_abs_diff(matmul(us.data(), vtv.data(), n, n, n), h.data()), 1e-5);
}

TEST_F(CudaVsCpu, SumSquaresMany) {
  // Sizes with one, several and the maximum number of partial blocks, and an empty tensor.
  const std::vector<int64_t> sizes = {1537, 0, 300000, 5, (int64_t{1} << 24) + 4097};
  std::vector<std::vector<float>> host;
  std::vector<std::span<const float>> cpu_spans, gpu_spans;
  for (size_t i = 0; i < sizes.size(); ++i)
    host.push_back(random_vector(sizes[i], 40 + i));
  for (const auto& x : host) {
    cpu_spans.emplace_back(x);
    gpu_spans.emplace_back(dev().upload(x), x.size());
  }
  const double want = cpu().sum_squares_many(cpu_spans);
  EXPECT_NEAR(gpu().sum_squares_many(gpu_spans), want, 1e-12 * want);
  // On the device too the list gives what the loop over sum_squares gives, bit for bit.
  double loop = 0;
  for (std::span<const float> x : gpu_spans)
    loop += gpu().sum_squares(x.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(gpu().sum_squares_many(gpu_spans), loop);
  EXPECT_EQ(gpu().sum_squares_many({}), 0.0);
  // The form that leaves the sum on the device, then the step's factor computed there.
  float* out = dev().upload(std::vector<float>(4, -1.0f));  // a double and a float
  double* sum = reinterpret_cast<double*>(out);
  gpu().sum_squares_many(gpu_spans, sum);
  double got = 0;
  gpu().copy_to_host(&got, sum, sizeof got);
  EXPECT_EQ(got, loop);
  for (double mean : {1.0, 0.125})
    for (double max_norm : {0.0, 1.0, 1e9}) {
      gpu().grad_clip_scale(out + 2, sum, mean, max_norm);
      EXPECT_EQ(dev().download(out + 2, 1)[0], kmath::grad_clip_scale(loop, mean, max_norm))
          << mean << " " << max_norm;
    }
  gpu().sum_squares_many({}, sum);
  gpu().copy_to_host(&got, sum, sizeof got);
  EXPECT_EQ(got, 0.0);
}

TEST_F(CudaVsCpu, ScaleManyScalesEachTensorAsScale) {
  // Chunks of one tensor and several in one launch, an empty tensor among them.
  const std::vector<int64_t> sizes = {1537, 0, 300000, 5, 16384};
  std::vector<std::vector<float>> host;
  std::vector<std::span<float>> many, one;
  for (size_t i = 0; i < sizes.size(); ++i) {
    host.push_back(random_vector(sizes[i], 60 + i));
    many.emplace_back(dev().upload(host.back()), host.back().size());
    one.emplace_back(dev().upload(host.back()), host.back().size());
  }
  gpu().scale_many(many, -1.25f);
  for (size_t i = 0; i < sizes.size(); ++i) {
    gpu().scale(one[i].data(), -1.25f, sizes[i]);
    auto want = host[i];
    cpu().scale(want.data(), -1.25f, sizes[i]);
    EXPECT_EQ(dev().download(many[i].data(), host[i].size()), want) << "tensor " << i;
    EXPECT_EQ(dev().download(one[i].data(), host[i].size()), want) << "tensor " << i;
  }
  gpu().scale_many({}, 2.0f);  // nothing to do
  // The factor read on the device: the same bits.
  float* factor = dev().upload(std::vector<float>{0.75f});
  std::vector<std::span<float>> again;
  for (size_t i = 0; i < sizes.size(); ++i)
    again.emplace_back(dev().upload(host[i]), host[i].size());
  gpu().scale_many_by(again, factor);
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto want = host[i];
    cpu().scale(want.data(), 0.75f, sizes[i]);
    EXPECT_EQ(dev().download(again[i].data(), host[i].size()), want) << "tensor " << i;
  }
}

// ---- model: loss reduction, MoE routing, rows added in order -------------------------------

TEST_F(CudaVsCpu, LossReduction) {
  const int64_t n = 5000;
  auto losses = random_vector(n, 1, 3.0f);
  for (float& x : losses)
    x = std::abs(x);
  float mean = 0.0f;
  cpu().mean_loss(&mean, losses.data(), n);
  float* gmean = dev().alloc<float>(1);
  gpu().mean_loss(gmean, dev().upload(losses), n);
  EXPECT_CLOSE(dev().download(gmean, 1), std::vector<float>{mean}, 1e-7);

  std::vector<float> terms = {2.5f, 0.0125f};
  double acc = 0.75;
  cpu().accumulate_loss(&acc, terms.data(), 2);
  double* gacc = dev().upload(std::vector<double>{0.75});
  gpu().accumulate_loss(gacc, dev().upload(terms), 2);
  EXPECT_EQ(dev().download(gacc, 1)[0], acc);  // one float add and one double add: exact
}

TEST_F(CudaVsCpu, MoeRouteAndRouterBackward) {
  for (auto [N, E, K] : {std::tuple<int64_t, int64_t, int64_t>{300, 8, 2}, {37, 5, 3}, {9, 4, 4}}) {
    auto logits = random_vector(N * E, 1, 2.0f);
    logits[E + 1] = logits[E];  // a tie between experts 0 and 1 of token 1
    std::vector<float> probs(N * E);
    cpu().softmax_forward(probs.data(), logits.data(), N, E);
    struct Host {
      std::vector<int32_t> chosen, slot_row, row_token, offset;
      std::vector<float> row_gate, sel_sum, frac;
      std::vector<double> mass;
    } h{std::vector<int32_t>(N * K), std::vector<int32_t>(N * K), std::vector<int32_t>(N * K),
        std::vector<int32_t>(E + 1), std::vector<float>(N * K),   std::vector<float>(N),
        std::vector<float>(E),       std::vector<double>(E)};
    MoeRouting cr{h.chosen.data(),  h.slot_row.data(), h.row_token.data(), h.row_gate.data(),
                  h.sel_sum.data(), h.frac.data(),     h.offset.data(),    h.mass.data()};
    MoeRouting gr{dev().alloc<int32_t>(N * K), dev().alloc<int32_t>(N * K),
                  dev().alloc<int32_t>(N * K), dev().alloc<float>(N * K),
                  dev().alloc<float>(N),       dev().alloc<float>(E),
                  dev().alloc<int32_t>(E + 1), dev().alloc<double>(E)};
    const float aux_weight = 0.01f;
    float aux = 0.25f;
    cpu().moe_route(cr, &aux, probs.data(), N, E, K, aux_weight);
    float* gaux = dev().upload(std::vector<float>{0.25f});
    float* gprobs = dev().upload(probs);
    gpu().moe_route(gr, gaux, gprobs, N, E, K, aux_weight);
    EXPECT_EQ(dev().download(gr.chosen, N * K), h.chosen);
    EXPECT_EQ(dev().download(gr.slot_row, N * K), h.slot_row);
    EXPECT_EQ(dev().download(gr.row_token, N * K), h.row_token);
    EXPECT_EQ(dev().download(gr.offset, E + 1), h.offset);
    EXPECT_CLOSE(dev().download(gr.row_gate, N * K), h.row_gate, 1e-6);
    EXPECT_CLOSE(dev().download(gr.sel_sum, N), h.sel_sum, 1e-6);
    EXPECT_CLOSE(dev().download(gr.frac, E), h.frac, 1e-7);
    EXPECT_CLOSE(dev().download(gaux, 1), std::vector<float>{aux}, 1e-6);

    auto dgate = random_vector(N * K, 2);
    auto dprobs0 = random_vector(N * E, 3);
    auto dprobs = dprobs0;
    cpu().moe_router_backward(dprobs.data(), cr, dgate.data(), N, E, K, aux_weight);
    float* gdprobs = dev().upload(dprobs0);
    gpu().moe_router_backward(gdprobs, gr, dev().upload(dgate), N, E, K, aux_weight);
    EXPECT_CLOSE(dev().download(gdprobs, N * E), dprobs, 1e-5) << "N=" << N << " E=" << E;
  }
}

// Many rows onto few destinations: without atomics the sums are the same on every run, and each
// destination adds its rows in position order as the CPU does.
TEST_F(CudaVsCpu, ScatterAndEmbeddingBackwardAreRunToRunIdentical) {
  const int64_t n = 4096, D = 40, rows = 3;
  auto src = random_vector(n * D, 1), weight = random_vector(n, 2);
  auto index = random_ids(n, rows, 3);
  auto dst0 = random_vector(rows * D, 4);
  auto want = dst0;
  cpu().scatter_add_rows(want.data(), src.data(), index.data(), weight.data(), n, D);
  float *gsrc = dev().upload(src), *gw = dev().upload(weight);
  int32_t* gi = dev().upload(index);
  std::vector<float> first;
  for (int run = 0; run < 3; ++run) {
    float* gdst = dev().upload(dst0);
    gpu().scatter_add_rows(gdst, gsrc, gi, gw, n, D);
    auto got = dev().download(gdst, rows * D);
    EXPECT_CLOSE(got, want, 1e-5);
    if (run == 0) first = got;
    EXPECT_EQ(std::memcmp(got.data(), first.data(), got.size() * sizeof(float)), 0) << run;
  }
  const int64_t B = 8, T = 512, V = 5;
  auto tokens = random_ids(B * T, V, 5);
  auto dout = random_vector(B * T * D, 6);
  std::vector<float> dwte(V * D, 0.0f);
  cpu().embedding_backward(dwte.data(), nullptr, dout.data(), tokens.data(), B, T, D);
  int32_t* gt = dev().upload(tokens);
  float* gdout = dev().upload(dout);
  std::vector<float> first_dwte;
  for (int run = 0; run < 3; ++run) {
    float* gdwte = dev().upload(std::vector<float>(V * D, 0.0f));
    gpu().embedding_backward(gdwte, nullptr, gdout, gt, B, T, D);
    auto got = dev().download(gdwte, V * D);
    EXPECT_CLOSE(got, dwte, 1e-5);
    if (run == 0) first_dwte = got;
    EXPECT_EQ(std::memcmp(got.data(), first_dwte.data(), got.size() * sizeof(float)), 0) << run;
  }
  std::vector<int32_t> bad = {2, -1, 0};
  gpu().scatter_add_rows(dev().upload(dst0), gsrc, dev().upload(bad), nullptr, 3, D);
  try {
    gpu().synchronize();
    FAIL() << "a negative row index was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("position 1"), std::string::npos) << e.what();
  }
}

// ---- SOAP family --------------------------------------------------------------------------------

TEST_F(CudaVsCpu, ColumnSignConvention) {
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{37, 37}, {64, 9}, {5, 300}}) {
    auto q = random_vector(rows * cols, 40 + rows);
    float* gq = dev().upload(q);
    gpu().canonicalize_column_signs(gq, rows, cols);
    cpu().canonicalize_column_signs(q.data(), rows, cols);
    EXPECT_EQ(dev().download(gq, q.size()), q) << rows << " x " << cols;
  }
}

// Record #89's key offset: the same shift on both devices (copies and sums of two, exact), and
// on the CPU the dimensions it moves are the truncated rotary's unrotated ones.
TEST_F(CudaVsCpu, KeyOffset) {
  const int64_t BH = 3, T = 5, hd = 16;
  const auto k = random_vector(BH * T * hd, 21), dout = random_vector(BH * T * hd, 22);
  std::vector<float> out(k.size()), dk(k.size());
  cpu().key_offset_forward(out.data(), k.data(), BH, T, hd);
  cpu().key_offset_backward(dk.data(), dout.data(), BH, T, hd);
  float* gk = dev().upload(k);
  float* gout = dev().upload(std::vector<float>(k.size()));
  gpu().key_offset_forward(gout, gk, BH, T, hd);
  EXPECT_EQ(dev().download(gout, out.size()), out);
  float* gd = dev().upload(dout);
  float* gdk = dev().upload(std::vector<float>(k.size()));
  gpu().key_offset_backward(gdk, gd, BH, T, hd);
  EXPECT_EQ(dev().download(gdk, dk.size()), dk);
  for (int64_t t = 1; t < T; ++t) {
    EXPECT_EQ(out[t * hd + 3], k[t * hd + 3]);          // rotated (j < hd/4)
    EXPECT_EQ(out[t * hd + 5], k[(t - 1) * hd + 5]);    // unrotated, first half
    EXPECT_EQ(out[t * hd + 15], k[(t - 1) * hd + 15]);  // unrotated, second half
  }
}

TEST_F(CudaVsCpu, BlockCopyIdentityAndColumnOrder) {
  // A [5, 7] block of a [9, 11] matrix into a [6, 8] one, both at an offset.
  auto src = random_vector(9 * 11, 1), dst = random_vector(6 * 8, 2);
  const std::vector<float> before = dst;
  float* gsrc = dev().upload(src);
  float* gdst = dev().upload(dst);
  gpu().copy_block_2d(gdst + 8 + 1, 8, gsrc + 2 * 11 + 3, 11, 5, 7);
  cpu().copy_block_2d(dst.data() + 8 + 1, 8, src.data() + 2 * 11 + 3, 11, 5, 7);
  EXPECT_EQ(dev().download(gdst, dst.size()), dst);
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t j = 0; j < 8; ++j) {
      const bool inside = i >= 1 && i < 6 && j >= 1 && j < 8;
      EXPECT_EQ(dst[i * 8 + j], inside ? src[(i + 1) * 11 + j + 2] : before[i * 8 + j]);
    }

  const int64_t n = 37;
  float* gq = dev().upload(random_vector(n * n, 3));
  gpu().set_identity(gq, n);
  EXPECT_EQ(dev().download(gq, n * n), identity(n));

  // Columns reversed, and gathered in an arbitrary order (a rotation of the columns).
  const int64_t rows = 13, cols = 300;
  auto a = random_vector(rows * cols, 4);
  float* ga = dev().upload(a);
  std::vector<float> rev(rows * cols), gathered(rows * cols);
  float* grev = dev().alloc<float>(rows * cols);
  float* ggathered = dev().alloc<float>(rows * cols);
  gpu().reverse_columns(grev, ga, rows, cols);
  cpu().reverse_columns(rev.data(), a.data(), rows, cols);
  EXPECT_EQ(dev().download(grev, rev.size()), rev);
  EXPECT_EQ(rev[2 * cols], a[2 * cols + cols - 1]);
  std::vector<int32_t> order(cols);
  for (int64_t j = 0; j < cols; ++j)
    order[j] = static_cast<int32_t>((j + 17) % cols);
  gpu().gather_columns(ggathered, ga, dev().upload(order), rows, cols);
  cpu().gather_columns(gathered.data(), a.data(), order.data(), rows, cols);
  EXPECT_EQ(dev().download(ggathered, gathered.size()), gathered);
  EXPECT_EQ(gathered[3 * cols], a[3 * cols + 17]);
}

TEST_F(CudaVsCpu, GatherColumnsReportsAnIndexOutOfRange) {
  const int64_t rows = 4, cols = 6;
  float* a = dev().upload(random_vector(rows * cols, 1));
  float* out = dev().alloc<float>(rows * cols);
  const std::vector<int32_t> order = {0, 1, 2, 6, 4, 5};
  gpu().gather_columns(out, a, dev().upload(order), rows, cols);
  try {
    gpu().synchronize();
    FAIL() << "an index equal to the column count was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gather_columns"), std::string::npos) << e.what();
  }
  std::vector<float> host(rows * cols);
  EXPECT_THROW(cpu().gather_columns(host.data(), host.data(), order.data(), rows, cols), Error);
}

TEST_F(CudaVsCpu, ArgsortIsStableDescendingWithNanLast) {
  // Few distinct values (many ties), a NaN and infinities; sizes below and above one block.
  for (int64_t n : {1, 7, 256, 1031}) {
    auto x = random_vector(n, 5 + n);
    for (float& v : x)
      v = std::round(4.0f * v) / 4.0f;
    if (n > 3) {
      x[1] = std::nanf("");
      x[2] = INFINITY;
      x[n - 1] = -INFINITY;
    }
    std::vector<int32_t> want(n);
    int32_t* gorder = dev().alloc<int32_t>(n);
    gpu().argsort_descending(gorder, dev().upload(x), n);
    cpu().argsort_descending(want.data(), x.data(), n);
    EXPECT_EQ(dev().download(gorder, n), want) << "n = " << n;
  }
}

TEST_F(CudaVsCpu, ColumnDots) {
  const int64_t rows = 300, cols = 257;
  auto a = random_vector(rows * cols, 6), b = random_vector(rows * cols, 7);
  std::vector<float> dots(cols);
  float* gdots = dev().alloc<float>(cols);
  gpu().column_dots(gdots, dev().upload(a), dev().upload(b), rows, cols);
  cpu().column_dots(dots.data(), a.data(), b.data(), rows, cols);
  // Exact float products added in float64 in the same order: the same bits.
  EXPECT_EQ(dev().download(gdots, cols), dots);
}

TEST_F(CudaVsCpu, LerpAndAddScaled) {
  const int64_t n = 70001;
  for (float w : {0.05f, 0.5f, 0.9f}) {  // both branches of torch.lerp
    auto a = random_vector(n, 10), b = random_vector(n, 11);
    float* ga = dev().upload(a);
    gpu().lerp(ga, dev().upload(b), w, n);
    cpu().lerp(a.data(), b.data(), w, n);
    EXPECT_CLOSE(dev().download(ga, n), a, 1e-6) << "w = " << w;
  }
  auto y = random_vector(n, 12), x = random_vector(n, 13);
  float* gy = dev().upload(y);
  gpu().add_scaled(gy, -0.03f, dev().upload(x), n);
  cpu().add_scaled(y.data(), -0.03f, x.data(), n);
  EXPECT_CLOSE(dev().download(gy, n), y, 1e-6);
  gpu().add_scaled(gy, -0.01f, gy, n);  // x aliasing y (decay P + alpha P)
  cpu().add_scaled(y.data(), -0.01f, y.data(), n);
  EXPECT_CLOSE(dev().download(gy, n), y, 1e-6);
}

TEST_F(CudaVsCpu, OrderedSumOfSquares) {
  for (int64_t n : {int64_t{1}, int64_t{4097}, (int64_t{1} << 20) + 3}) {
    const double want = cpu().sum_squares_in_order(random_vector(n, 20 + n).data(), n);
    EXPECT_NEAR(gpu().sum_squares_in_order(dev().upload(random_vector(n, 20 + n)), n), want,
                1e-12 * want)
        << "n = " << n;
  }
  EXPECT_EQ(gpu().sum_squares_in_order(nullptr, 0), 0.0);
}

}  // namespace
}  // namespace core
